//! The command's user in an image root (docs/images.md): images know
//! their own users, not the caller's uid, yet `whoami`, git, pip --user
//! and ssh-keygen all look the uid up. So before the command runs, a uid
//! the image has no entry for gets one in /etc/passwd (and its gid one in
//! /etc/group), named after the caller, with a home in /home. These files
//! live in the overlay, so the change is gone when the VM ends.
//!
//! The parsing is pure and unit-tested; `ensure` writes the real files.

use std::ffi::CString;
use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::path::Path;

const PASSWD: &str = "/etc/passwd";
const GROUP: &str = "/etc/group";

/// The home of `uid` per the passwd text, if it has an entry.
fn home_of(passwd: &str, uid: u32) -> Option<String> {
    passwd.lines().find_map(|line| {
        let fields: Vec<&str> = line.split(':').collect();
        (fields.len() >= 7 && fields[2].parse() == Ok(uid)).then(|| fields[5].to_string())
    })
}

/// Whether an entry (passwd or group) already has this name.
fn name_taken(text: &str, name: &str) -> bool {
    text.lines()
        .any(|line| line.split(':').next() == Some(name))
}

/// Whether a group entry has this gid.
fn has_gid(group: &str, gid: u32) -> bool {
    group
        .lines()
        .any(|line| line.split(':').nth(2).and_then(|g| g.parse().ok()) == Some(gid))
}

/// A name free in `passwd`: `wanted`, else `wanted` + uid.
fn free_name(passwd: &str, wanted: &str, uid: u32) -> String {
    if name_taken(passwd, wanted) {
        format!("{wanted}{uid}")
    } else {
        wanted.to_string()
    }
}

/// The lines to append: (passwd line, group line if the gid has none,
/// home directory).
fn entries(
    passwd: &str,
    group: &str,
    wanted: &str,
    uid: u32,
    gid: u32,
    shell: &str,
) -> (String, Option<String>, String) {
    let name = free_name(passwd, wanted, uid);
    let home = format!("/home/{name}");
    let user = format!("{name}:x:{uid}:{gid}:{name}:{home}:{shell}\n");
    let group_line = (!has_gid(group, gid)).then(|| {
        let gname = if name_taken(group, &name) {
            format!("{name}{gid}")
        } else {
            name.clone()
        };
        format!("{gname}:x:{gid}:\n")
    });
    (user, group_line, home)
}

/// Makes sure `uid` and `gid` have entries; returns the user's home.
pub fn ensure(wanted: &str, uid: u32, gid: u32) -> io::Result<CString> {
    let passwd = fs::read_to_string(PASSWD).unwrap_or_default();
    if let Some(home) = home_of(&passwd, uid) {
        return CString::new(home).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e));
    }
    let group = fs::read_to_string(GROUP).unwrap_or_default();
    let shell = if Path::new("/bin/bash").exists() {
        "/bin/bash"
    } else {
        "/bin/sh"
    };
    let (user, group_line, home) = entries(&passwd, &group, wanted, uid, gid, shell);
    append(PASSWD, &passwd, &user)?;
    if let Some(line) = group_line {
        append(GROUP, &group, &line)?;
    }
    fs::create_dir_all("/home")?;
    CString::new(home).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// Appends `line`, first ending an unterminated last line.
fn append(path: &str, old: &str, line: &str) -> io::Result<()> {
    let mut f = OpenOptions::new().create(true).append(true).open(path)?;
    if !old.is_empty() && !old.ends_with('\n') {
        f.write_all(b"\n")?;
    }
    f.write_all(line.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    const PASSWD_TEXT: &str =
        "root:x:0:0:root:/root:/bin/bash\nuser:x:1001:1001::/srv/user:/bin/sh\n";
    const GROUP_TEXT: &str = "root:x:0:\nuser:x:1001:\nstaff:x:50:\n";

    #[test]
    fn an_existing_uid_keeps_its_entry_and_home() {
        assert_eq!(home_of(PASSWD_TEXT, 1001).as_deref(), Some("/srv/user"));
        assert_eq!(home_of(PASSWD_TEXT, 0).as_deref(), Some("/root"));
        assert_eq!(home_of(PASSWD_TEXT, 1000), None);
        assert_eq!(home_of("broken:line\n", 0), None);
    }

    #[test]
    fn a_new_uid_gets_the_callers_name_and_a_group() {
        let (user, group, home) =
            entries(PASSWD_TEXT, GROUP_TEXT, "alice", 1000, 1000, "/bin/bash");
        assert_eq!(user, "alice:x:1000:1000:alice:/home/alice:/bin/bash\n");
        assert_eq!(group.as_deref(), Some("alice:x:1000:\n"));
        assert_eq!(home, "/home/alice");
    }

    #[test]
    fn taken_names_and_existing_groups() {
        let (user, group, home) = entries(PASSWD_TEXT, GROUP_TEXT, "user", 1000, 50, "/bin/sh");
        assert_eq!(user, "user1000:x:1000:50:user1000:/home/user1000:/bin/sh\n");
        assert_eq!(group, None, "gid 50 has a group already");
        assert_eq!(home, "/home/user1000");
    }
}
