//! An image's root as a plain file: the EROFS image and, beside it in
//! FILE.json, what the image says about running it. `mvm image
//! export-root` writes the pair; `make` does so for the default image, so
//! that `--image default` boots `share/mvm/images/debian.erofs` beside the
//! binary like the kernel, with no store and no conversion at run time.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use mvm_image::ImageConfig;
use serde_json::{json, Value};

use super::{beside_binary, setup_failure, Failure};

/// The default image's root file, beside the binary (`make` writes it).
const DEFAULT_ROOT: &str = "share/mvm/images/debian.erofs";

/// FILE.json for FILE.
fn config_path(root: &Path) -> PathBuf {
    let mut name = root.as_os_str().to_owned();
    name.push(".json");
    PathBuf::from(name)
}

/// Copies the converted root `from` to `to` and writes `to`.json, each
/// through a temporary file renamed into place, so an interrupted export
/// leaves the old pair or none.
pub fn export(
    from: &Path,
    config: &ImageConfig,
    manifest_digest: &str,
    to: &Path,
) -> Result<(), Failure> {
    let fail = |what: &str, e: std::io::Error| {
        setup_failure(format!("cannot write {what} {}: {e}", to.display()))
    };
    let partial = to.with_extension("erofs.partial");
    fs::copy(from, &partial).map_err(|e| fail("the root file", e))?;
    // The store keeps its files to its owner; an exported root is meant to
    // be booted by whoever runs the binary beside it, like the kernel.
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(&partial, fs::Permissions::from_mode(0o644))
        .map_err(|e| fail("the root file", e))?;
    let meta = json!({
        "manifest": manifest_digest,
        "env": config.env,
        "working_dir": config.working_dir,
        "entrypoint": config.entrypoint,
        "cmd": config.cmd,
        "user": config.user,
    });
    let json_path = config_path(to);
    let json_partial = json_path.with_extension("json.partial");
    let written = fs::File::create(&json_partial)
        .and_then(|mut f| f.write_all(format!("{meta:#}\n").as_bytes()));
    if let Err(e) = written {
        let _ = fs::remove_file(&partial);
        let _ = fs::remove_file(&json_partial);
        return Err(fail("the root's config", e));
    }
    fs::rename(&partial, to).map_err(|e| fail("the root file", e))?;
    fs::rename(&json_partial, &json_path).map_err(|e| fail("the root's config", e))
}

/// The default image's exported root, if `make` built it.
pub fn default_root() -> Result<Option<(PathBuf, ImageConfig)>, Failure> {
    let Some(root) = beside_binary(DEFAULT_ROOT).filter(|p| p.is_file()) else {
        return Ok(None);
    };
    let config = read_config(&config_path(&root))?;
    Ok(Some((root, config)))
}

fn read_config(path: &Path) -> Result<ImageConfig, Failure> {
    let bad = |why: String| {
        setup_failure(format!(
            "cannot read the image root's config {}: {why} (run `make` again)",
            path.display()
        ))
    };
    let value: Value = serde_json::from_slice(&fs::read(path).map_err(|e| bad(e.to_string()))?)
        .map_err(|e| bad(e.to_string()))?;
    let strings = |key: &str| -> Vec<String> {
        value[key]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|v| v.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default()
    };
    let text = |key: &str| value[key].as_str().map(String::from);
    Ok(ImageConfig {
        env: strings("env"),
        working_dir: text("working_dir"),
        entrypoint: strings("entrypoint"),
        cmd: strings("cmd"),
        user: text("user"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_exported_root_reads_back_with_its_config() {
        let dir = std::env::temp_dir().join(format!("mvm-root-file-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let from = dir.join("src.erofs");
        fs::write(&from, b"erofs bytes").unwrap();
        let config = ImageConfig {
            env: vec!["PATH=/bin".into()],
            working_dir: Some("/srv".into()),
            entrypoint: vec![],
            cmd: vec!["/bin/bash".into()],
            user: None,
        };
        let to = dir.join("out.erofs");
        export(&from, &config, "sha256:ab", &to).unwrap();
        assert_eq!(fs::read(&to).unwrap(), b"erofs bytes");
        assert_eq!(read_config(&config_path(&to)).unwrap(), config);
        assert!(!dir.join("out.erofs.partial").exists());
        fs::write(config_path(&to), b"{not json").unwrap();
        assert!(read_config(&config_path(&to)).is_err());
        fs::remove_dir_all(&dir).unwrap();
    }
}
