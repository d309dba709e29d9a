//! `mvm image import|ls|rm|pull` and what `mvm run --image REF` needs from
//! the image store (docs/images.md): REF imported if it names a source,
//! found in the store otherwise (pulled if it names a registry and is not
//! there), and converted to an EROFS root on first use. Every failure is one line and exit 125 with the store unchanged
//! (the store's own rule, crates' `mvm-image`).

use std::path::PathBuf;

use clap::Subcommand;
use mvm_image::{
    names_a_registry, Image, ImageConfig, ImageSource, Limits, Store, TerminalProgress,
};

use super::pull::pull;
use super::{beside_binary, setup_failure, Failure};

/// The name `--image default` stands for: the Debian image `make` builds
/// (rootfs/debian), imported from beside the binary on first use.
pub const DEFAULT_IMAGE: &str = "default";
/// `--image none`: no image, the busybox initramfs is the root.
pub const NO_IMAGE: &str = "none";
/// Where `make` puts the default image's OCI layout, beside the binary.
const DEFAULT_LAYOUT: &str = "share/mvm/images/debian";
/// Its tag in that layout, and its name in the store.
const DEFAULT_TAG: &str = "debian-bookworm";

#[derive(Subcommand, Debug)]
pub enum ImageCommand {
    /// Copy an image into the store: oci:DIR[:TAG] (an OCI image layout)
    /// or docker-archive:FILE (`docker save` / `podman save` output), and
    /// convert it to its root filesystem. Every blob is checked against
    /// its digest; a second import of the same image copies nothing and
    /// converts nothing.
    Import {
        /// oci:DIR[:TAG] or docker-archive:FILE
        #[arg(value_name = "SOURCE")]
        source: String,
        /// Name it NAME[:TAG] in the store [default: the source's tag]
        #[arg(long, value_name = "NAME")]
        name: Option<String>,
    },
    /// List the images in the store
    Ls,
    /// Remove an image (NAME[:TAG] or sha256:DIGEST); its blobs and
    /// converted root go unless another name uses them
    Rm {
        #[arg(value_name = "IMAGE")]
        reference: String,
    },
    /// Convert an image (a source or a stored IMAGE) to its root
    /// filesystem as a plain EROFS file FILE, with its run config in
    /// FILE.json: what `mvm run --rootfs FILE` boots, and how `make`
    /// prepares the default image
    ExportRoot {
        #[arg(value_name = "IMAGE")]
        reference: String,
        #[arg(value_name = "FILE")]
        file: PathBuf,
    },
    /// Pull an image from a registry: HOST[:PORT]/NAME[:TAG] or
    /// HOST[:PORT]/NAME@sha256:DIGEST (linux/amd64). Credentials come from
    /// the docker/podman auth files; blobs already stored are not fetched
    /// again; the image is named HOST[:PORT]/NAME:TAG in the store
    Pull {
        #[arg(value_name = "REF")]
        reference: String,
        /// Speak plain HTTP to this registry (HOST[:PORT]); repeatable,
        /// and added to $MVM_INSECURE_REGISTRIES (comma-separated)
        #[arg(long, value_name = "HOST[:PORT]")]
        insecure_registry: Vec<String>,
    },
}

/// An image ready to boot: its EROFS root and how to run it.
pub struct Prepared {
    pub rootfs: PathBuf,
    pub config: ImageConfig,
}

fn store() -> Result<Store, Failure> {
    let root = Store::default_root().map_err(setup_failure)?;
    Store::open(&root).map_err(setup_failure)
}

/// `mvm run --image REF`: the image imported (a source) or found, else
/// pulled if REF names a registry, then its root converted (once; later
/// runs take the cached one). A registry image already in the store is
/// used as it is, with no network and no client started: `mvm image pull`
/// refreshes it.
pub fn prepare(reference: &str, insecure: &[String]) -> Result<Prepared, Failure> {
    if reference == DEFAULT_IMAGE {
        if let Some((rootfs, config)) = super::root_file::default_root()? {
            return Ok(Prepared { rootfs, config });
        }
    }
    let store = store()?;
    let mut progress = TerminalProgress::new();
    let image = if reference == DEFAULT_IMAGE {
        default_image(&store, &mut progress)?
    } else if let Some(source) = ImageSource::parse(reference).map_err(setup_failure)? {
        store
            .import(&source, None, &mut progress)
            .map_err(setup_failure)?
    } else {
        match store.find(reference) {
            Ok(image) => image,
            // A digest reference (HOST/NAME@sha256:..) is not a store name:
            // `pull` finds it in the store itself, with no request.
            Err(_) if names_a_registry(reference) => pull(&store, reference, insecure)?,
            Err(e) => return Err(setup_failure(e)),
        }
    };
    let rootfs = convert(&store, &image)?;
    Ok(Prepared {
        rootfs: rootfs.path,
        config: image.config,
    })
}

/// The default image: the one in the store under its tag when it is the
/// layout's (same manifest digest: no blob is read again), else imported
/// from the layout `make` installs beside the binary.
fn default_image(store: &Store, progress: &mut TerminalProgress) -> Result<Image, Failure> {
    let layout = beside_binary(DEFAULT_LAYOUT).filter(|dir| dir.join("index.json").is_file());
    let stored = store.find(DEFAULT_TAG).ok();
    let Some(dir) = layout else {
        return stored.ok_or_else(|| {
            setup_failure(format!(
                "the default image is not built: run `make` (it builds {DEFAULT_LAYOUT} beside the mvm binary), or pass --image REF, or --image none for the busybox guest"
            ))
        });
    };
    if let (Some(image), Some(digest)) = (&stored, layout_digest(&dir, DEFAULT_TAG)) {
        if image.manifest_digest == digest {
            return Ok(image.clone());
        }
    }
    let source = ImageSource::OciLayout {
        dir,
        tag: Some(DEFAULT_TAG.into()),
    };
    store
        .import(&source, Some(DEFAULT_TAG), progress)
        .map_err(setup_failure)
}

/// The manifest digest an OCI layout's index.json gives `tag`; None when
/// it cannot tell (the import then reads the layout properly).
fn layout_digest(dir: &std::path::Path, tag: &str) -> Option<String> {
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("index.json")).ok()?).ok()?;
    index["manifests"].as_array()?.iter().find_map(|m| {
        (m["annotations"]["org.opencontainers.image.ref.name"].as_str() == Some(tag))
            .then(|| m["digest"].as_str().map(String::from))?
    })
}

/// The converted root, said in a line (how long a conversion took).
fn convert(store: &Store, image: &Image) -> Result<mvm_image::Rootfs, Failure> {
    let started = std::time::Instant::now();
    let rootfs = store
        .rootfs(image, &Limits::default(), &mut TerminalProgress::new())
        .map_err(setup_failure)?;
    if rootfs.converted {
        eprintln!(
            "mvm: converted {} to its root filesystem in {:.1} s ({} entries, {} MiB)",
            image.name.as_deref().unwrap_or(&image.manifest_digest),
            started.elapsed().as_secs_f64(),
            rootfs.entries,
            rootfs.bytes >> 20
        );
    }
    Ok(rootfs)
}

/// The line an import or pull ends with (tests read the blob count).
fn print_imported(image: &Image) {
    println!(
        "{} {} ({} blobs copied, {} bytes)",
        image.name.as_deref().unwrap_or("<none>"),
        image.manifest_digest,
        image.imported.blobs_copied,
        image.imported.bytes_copied
    );
}

/// `mvm image ...`; prints what was done.
pub fn command(cmd: &ImageCommand) -> Result<i32, Failure> {
    match cmd {
        ImageCommand::Import { source, name } => {
            let Some(source) = ImageSource::parse(source).map_err(setup_failure)? else {
                return Err(setup_failure(format!(
                    "'{source}' is not an image source: use oci:DIR[:TAG] or docker-archive:FILE"
                )));
            };
            let store = store()?;
            let image = store
                .import(&source, name.as_deref(), &mut TerminalProgress::new())
                .map_err(setup_failure)?;
            // Converted now, like `docker pull` unpacks: the first run
            // does not pay for it.
            convert(&store, &image)?;
            print_imported(&image);
        }
        ImageCommand::Ls => {
            let images = store()?.list().map_err(setup_failure)?;
            println!(
                "{:<40} {:<19} {:>6} {:>12}",
                "NAME", "DIGEST", "LAYERS", "SIZE"
            );
            for image in images {
                let size: u64 = image.layers.iter().map(|l| l.size).sum();
                let digest = image
                    .manifest_digest
                    .strip_prefix("sha256:")
                    .unwrap_or(&image.manifest_digest);
                println!(
                    "{:<40} {:<19} {:>6} {:>12}",
                    image.name.as_deref().unwrap_or("<none>"),
                    &digest[..digest.len().min(12)],
                    image.layers.len(),
                    size
                );
            }
        }
        ImageCommand::Rm { reference } => {
            store()?.remove(reference).map_err(setup_failure)?;
            println!("removed {reference}");
        }
        ImageCommand::ExportRoot { reference, file } => {
            let store = store()?;
            let mut progress = TerminalProgress::new();
            let image = match ImageSource::parse(reference).map_err(setup_failure)? {
                Some(source) => store.import(&source, None, &mut progress),
                None => store.find(reference),
            }
            .map_err(setup_failure)?;
            let rootfs = convert(&store, &image)?;
            super::root_file::export(&rootfs.path, &image.config, &image.manifest_digest, file)?;
            println!(
                "{} {} -> {}",
                image.name.as_deref().unwrap_or("<none>"),
                image.manifest_digest,
                file.display()
            );
        }
        ImageCommand::Pull {
            reference,
            insecure_registry,
        } => {
            let image = pull(&store()?, reference, insecure_registry)?;
            print_imported(&image);
        }
    }
    Ok(0)
}

/// The command line an image runs: like `docker run`, the entrypoint
/// stays and the arguments given replace the image's Cmd.
pub fn argv(config: &ImageConfig, given: Vec<String>) -> Vec<String> {
    let tail = if given.is_empty() {
        config.cmd.clone()
    } else {
        given
    };
    config.entrypoint.iter().cloned().chain(tail).collect()
}

/// The image's Env as KEY=VALUE pairs (malformed entries skipped).
pub fn env(config: &ImageConfig) -> Vec<(String, String)> {
    config
        .env
        .iter()
        .filter_map(|kv| kv.split_once('='))
        .filter(|(k, _)| !k.is_empty())
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> ImageConfig {
        ImageConfig {
            env: vec!["PATH=/usr/bin:/bin".into(), "BROKEN".into(), "A=b=c".into()],
            entrypoint: vec!["/entry".into()],
            cmd: vec!["serve".into(), "--port=1".into()],
            ..ImageConfig::default()
        }
    }

    #[test]
    fn arguments_replace_cmd_and_keep_the_entrypoint() {
        assert_eq!(argv(&config(), vec![]), ["/entry", "serve", "--port=1"]);
        assert_eq!(argv(&config(), vec!["sh".into()]), ["/entry", "sh"]);
        let plain = ImageConfig {
            cmd: vec!["/bin/bash".into()],
            ..ImageConfig::default()
        };
        assert_eq!(argv(&plain, vec!["true".into()]), ["true"]);
        assert_eq!(argv(&plain, vec![]), ["/bin/bash"]);
        assert!(argv(&ImageConfig::default(), vec![]).is_empty());
    }

    #[test]
    fn env_pairs() {
        assert_eq!(
            env(&config()),
            [
                ("PATH".to_string(), "/usr/bin:/bin".to_string()),
                ("A".into(), "b=c".into())
            ]
        );
    }

    #[test]
    fn registry_references_are_told_from_store_names() {
        assert!(names_a_registry("registry.example:5000/app:1"));
        assert!(names_a_registry("localhost/app"));
        assert!(names_a_registry("127.0.0.1:5000/app"));
        assert!(!names_a_registry("app:1"));
        assert!(!names_a_registry("library/app"));
    }
}
