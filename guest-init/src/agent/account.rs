//! The command's user in an image root (docs/images.md): images know
//! their own users, not the caller's uid, yet `whoami`, git, pip --user
//! and ssh-keygen all look the uid up. So before the command runs, a uid
//! the image has no entry for gets one in /etc/passwd (and its gid one in
//! /etc/group), named after the caller, with a home in /home. These files
//! live in the overlay, so the change is gone when the VM ends.
//!
//! The parsing is pure and unit-tested; `ensure` writes the real files.

use std::ffi::{CString, OsStr};
use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use mvm_protocol::ExecRequest;

use super::request::Prepared;

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

/// Who `--user USER[:GROUP]` names, per the root's passwd and group text:
/// (uid, gid, home if the user has an entry). A numeric user without an
/// entry keeps its own number as gid (never root's group by default).
pub fn resolve(
    spec: &str,
    passwd: &str,
    group: &str,
) -> Result<(u32, u32, Option<String>), String> {
    let (user, grp) = match spec.split_once(':') {
        Some((u, g)) => (u, Some(g)),
        None => (spec, None),
    };
    let entry = passwd
        .lines()
        .map(|l| l.split(':').collect::<Vec<_>>())
        .find(|f| f.len() >= 7 && (f[0] == user || (user.parse::<u32>().is_ok() && f[2] == user)));
    let (uid, default_gid, home) = match (&entry, user.parse::<u32>()) {
        (Some(f), _) => {
            let uid = f[2]
                .parse()
                .map_err(|_| format!("bad uid in /etc/passwd for {user}"))?;
            let gid = f[3]
                .parse()
                .map_err(|_| format!("bad gid in /etc/passwd for {user}"))?;
            (uid, gid, Some(f[5].to_string()))
        }
        (None, Ok(uid)) => (uid, uid, None),
        (None, Err(_)) => return Err(format!("no user {user:?} in the image's /etc/passwd")),
    };
    let gid = match grp {
        None => default_gid,
        Some(g) => match g.parse::<u32>() {
            Ok(gid) => gid,
            Err(_) => group
                .lines()
                .map(|l| l.split(':').collect::<Vec<_>>())
                .find(|f| f.len() >= 3 && f[0] == g)
                .and_then(|f| f[2].parse().ok())
                .ok_or_else(|| format!("no group {g:?} in the image's /etc/group"))?,
        },
    };
    Ok((uid, gid, home))
}

/// `resolve` against the root's own files.
pub fn resolve_in_root(spec: &str) -> Result<(u32, u32, Option<String>), String> {
    let passwd = fs::read_to_string(PASSWD).unwrap_or_default();
    let group = fs::read_to_string(GROUP).unwrap_or_default();
    resolve(spec, &passwd, &group)
}

/// What `--user` and `user_name` (docs/protocol.md) change in a prepared
/// command: its uid, gid and home, and whether the home must be made.
pub fn apply(request: &ExecRequest, prepared: &mut Prepared) -> Result<(), String> {
    if request.user.is_none() && request.user_name.is_none() {
        return Ok(());
    }
    let mut home = None;
    if let Some(spec) = &request.user {
        let (uid, gid, known) = resolve_in_root(spec).map_err(|e| format!("--user {spec}: {e}"))?;
        prepared.uid = uid;
        prepared.gid = gid;
        home = known;
    }
    let (home, created) = match (home, &request.user_name) {
        (Some(home), _) => (Some(home), false),
        (None, Some(name)) if prepared.uid != 0 => {
            let (home, created) = ensure(name, prepared.uid, prepared.gid)
                .map_err(|e| format!("cannot add user {name} to /etc/passwd: {e}"))?;
            (Some(home), created)
        }
        _ => (None, false),
    };
    if let Some(home) = home {
        prepared.set_home(CString::new(home).map_err(|_| "a home directory contains a NUL byte")?);
    }
    // A user the image has keeps the home it says, made or not (nobody's
    // is /nonexistent, on purpose); one mvm added gets its home made.
    let home = Path::new(OsStr::from_bytes(prepared.home.as_bytes()));
    prepared.create_home = created && !home.exists() && home.parent().is_some_and(Path::is_dir);
    Ok(())
}

/// Makes sure `uid` and `gid` have entries; returns the user's home and
/// whether the entry is new.
pub fn ensure(wanted: &str, uid: u32, gid: u32) -> io::Result<(String, bool)> {
    let passwd = fs::read_to_string(PASSWD).unwrap_or_default();
    if let Some(home) = home_of(&passwd, uid) {
        return Ok((home, false));
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
    Ok((home, true))
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
    fn user_specs_resolve_by_name_and_number() {
        let r = |spec| resolve(spec, PASSWD_TEXT, GROUP_TEXT);
        assert_eq!(r("user"), Ok((1001, 1001, Some("/srv/user".into()))));
        assert_eq!(r("1001"), Ok((1001, 1001, Some("/srv/user".into()))));
        assert_eq!(r("user:staff"), Ok((1001, 50, Some("/srv/user".into()))));
        assert_eq!(r("4242"), Ok((4242, 4242, None)));
        assert_eq!(r("4242:7"), Ok((4242, 7, None)));
        assert_eq!(r("root"), Ok((0, 0, Some("/root".into()))));
        assert!(r("nosuch").unwrap_err().contains("no user"));
        assert!(r("user:nogroup").unwrap_err().contains("no group"));
    }

    #[test]
    fn taken_names_and_existing_groups() {
        let (user, group, home) = entries(PASSWD_TEXT, GROUP_TEXT, "user", 1000, 50, "/bin/sh");
        assert_eq!(user, "user1000:x:1000:50:user1000:/home/user1000:/bin/sh\n");
        assert_eq!(group, None, "gid 50 has a group already");
        assert_eq!(home, "/home/user1000");
    }
}
