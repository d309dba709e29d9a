//! The guest's hostname: `mvm` at boot, or the run's own from its setup
//! (`mvm run --hostname`, an OCI bundle's `hostname`), which /etc/hosts
//! then resolves as the image's own `mvm` line does (Docker writes the
//! container's name there the same way). Setting it acts on the guest;
//! the /etc/hosts text is unit-tested, and the e2e suite reads both back.

use std::io;

use crate::say;

const HOSTS: &str = "/etc/hosts";

/// Sets the kernel's hostname; a failure is a warning (the guest keeps
/// the name it had).
pub fn set(name: &str) {
    // SAFETY: name is valid for its length; sethostname copies it.
    if unsafe { libc::sethostname(name.as_ptr().cast(), name.len()) } != 0 {
        say!(
            "warning: sethostname {name}: {}",
            io::Error::last_os_error()
        );
    }
}

/// Adds `name` to the root's /etc/hosts (on its writable layer) unless a
/// line names it already. A root without /etc keeps none; a failure is a
/// warning (only resolving the name fails).
pub fn resolve_locally(name: &str) {
    if !std::path::Path::new("/etc").is_dir() {
        return;
    }
    let old = match std::fs::read_to_string(HOSTS) {
        Ok(text) => text,
        Err(e) if e.kind() == io::ErrorKind::NotFound => String::new(),
        Err(e) => return say!("warning: cannot read {HOSTS}: {e}"),
    };
    let Some(new) = hosts_with(&old, name) else {
        return;
    };
    if let Err(e) = std::fs::write(HOSTS, new) {
        say!("warning: cannot add {name} to {HOSTS}: {e}");
    }
}

/// `hosts` with a line for `name` on 127.0.1.1 (with `.localdomain` when
/// it has no domain, as Debian's installer writes it); None when a line
/// already names it.
fn hosts_with(hosts: &str, name: &str) -> Option<String> {
    let named = hosts.lines().any(|line| {
        let line = line.split('#').next().unwrap_or_default();
        line.split_whitespace().skip(1).any(|n| n == name)
    });
    if named {
        return None;
    }
    let mut text = hosts.to_string();
    if !text.is_empty() && !text.ends_with('\n') {
        text.push('\n');
    }
    let short = name.split('.').next().unwrap_or(name);
    match name.contains('.') {
        true => text.push_str(&format!("127.0.1.1\t{name} {short}\n")),
        false => text.push_str(&format!("127.0.1.1\t{name}.localdomain {name}\n")),
    }
    if !hosts
        .lines()
        .any(|l| l.split_whitespace().nth(1) == Some("localhost"))
    {
        text.insert_str(0, "127.0.0.1\tlocalhost\n");
    }
    Some(text)
}

#[cfg(test)]
mod tests {
    use super::hosts_with;

    #[test]
    fn the_name_is_added_once_and_the_rest_kept() {
        let image = "127.0.0.1\tlocalhost\n127.0.1.1\tmvm.localdomain mvm\n";
        assert_eq!(
            hosts_with(image, "ci-7").unwrap(),
            format!("{image}127.0.1.1\tci-7.localdomain ci-7\n")
        );
        assert_eq!(hosts_with(image, "mvm"), None);
        assert_eq!(
            hosts_with("127.0.0.1 localhost", "web.example").unwrap(),
            "127.0.0.1 localhost\n127.0.1.1\tweb.example web\n"
        );
        // A name in a comment is not a line naming it.
        assert!(hosts_with("127.0.0.1 localhost # ci-7\n", "ci-7").is_some());
        // No file at all: localhost too.
        assert_eq!(
            hosts_with("", "ci-7").unwrap(),
            "127.0.0.1\tlocalhost\n127.0.1.1\tci-7.localdomain ci-7\n"
        );
    }
}
