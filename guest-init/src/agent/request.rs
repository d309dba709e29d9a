//! Turning the host's `ExecRequest` into what the child needs after fork:
//! C strings (checked for NUL bytes before forking, so the child cannot fail
//! on them) and the command's exact environment. Pure, unit-tested.

use std::ffi::{CStr, CString};

use mvm_protocol::ExecRequest;

use crate::spawn::PATH;

/// Home of root; it is in the initramfs.
pub const ROOT_HOME: &CStr = c"/root";
/// Home of any other user; the child creates it (mode 0700, owned by the
/// user) on the tmpfs at /run, since the initramfs has no home for them.
pub const USER_HOME: &CStr = c"/run/home";
/// TERM on a pseudo-terminal: what the host's terminal most likely is; the
/// host can send its own TERM in the request's env, which wins.
pub const TTY_TERM: &CStr = c"xterm-256color";

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    #[error("empty command")]
    EmptyArgv,
    #[error("{what} contains a NUL byte")]
    Nul { what: &'static str },
    #[error("bad environment variable name {0:?}")]
    EnvName(String),
}

/// An `ExecRequest` ready for fork and exec.
#[derive(Debug, PartialEq, Eq)]
pub struct Prepared {
    pub argv: Vec<CString>,
    /// The whole environment, in order, each name once.
    pub env: Vec<(CString, CString)>,
    pub cwd: CString,
    pub home: CString,
    /// The child must create `home` for the user first.
    pub create_home: bool,
    pub uid: u32,
    pub gid: u32,
    pub tty: bool,
    pub rows: u16,
    pub cols: u16,
    pub max_procs: u64,
}

impl Prepared {
    /// Another home (the user's passwd entry's), in HOME too.
    pub fn set_home(&mut self, home: CString) {
        for (name, value) in &mut self.env {
            if name.as_c_str() == c"HOME" && value.as_c_str() == self.home.as_c_str() {
                *value = home.clone();
            }
        }
        self.home = home;
    }
}

pub fn prepare(req: &ExecRequest) -> Result<Prepared, RequestError> {
    if req.argv.first().is_none_or(|a| a.is_empty()) {
        return Err(RequestError::EmptyArgv);
    }
    let argv = req
        .argv
        .iter()
        .map(|a| cstring(a, "an argument"))
        .collect::<Result<_, _>>()?;
    let home = if req.uid == 0 { ROOT_HOME } else { USER_HOME };
    Ok(Prepared {
        argv,
        env: environment(req, home)?,
        cwd: cstring(&req.cwd, "the working directory")?,
        home: home.to_owned(),
        create_home: req.uid != 0,
        uid: req.uid,
        gid: req.gid,
        tty: req.tty,
        rows: req.rows,
        cols: req.cols,
        max_procs: req.max_procs,
    })
}

/// The command's environment: PATH, HOME, TERM (only on a tty), then the
/// request's variables, which replace a base one of the same name in place.
/// Of a name given twice in the request, the last value wins.
pub fn environment(
    req: &ExecRequest,
    home: &CStr,
) -> Result<Vec<(CString, CString)>, RequestError> {
    let mut env: Vec<(CString, CString)> = vec![
        (c"PATH".to_owned(), PATH.to_owned()),
        (c"HOME".to_owned(), home.to_owned()),
    ];
    if req.tty {
        env.push((c"TERM".to_owned(), TTY_TERM.to_owned()));
    }
    for (name, value) in &req.env {
        if name.is_empty() || name.contains('=') {
            return Err(RequestError::EnvName(name.clone()));
        }
        let name = cstring(name, "an environment variable name")?;
        let value = cstring(value, "an environment variable")?;
        match env.iter_mut().find(|(n, _)| *n == name) {
            Some(slot) => slot.1 = value,
            None => env.push((name, value)),
        }
    }
    Ok(env)
}

fn cstring(s: &str, what: &'static str) -> Result<CString, RequestError> {
    CString::new(s).map_err(|_| RequestError::Nul { what })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request() -> ExecRequest {
        ExecRequest {
            uid: 1000,
            gid: 1000,
            ..ExecRequest::new(vec!["ls".into(), "-l".into()])
        }
    }

    fn pairs(env: &[(CString, CString)]) -> Vec<(&str, &str)> {
        env.iter()
            .map(|(n, v)| (n.to_str().unwrap(), v.to_str().unwrap()))
            .collect()
    }

    const PATH_VALUE: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

    #[test]
    fn user_without_tty() {
        let p = prepare(&request()).unwrap();
        assert_eq!(
            pairs(&p.env),
            [("PATH", PATH_VALUE), ("HOME", "/run/home")],
            "no TERM without a tty"
        );
        assert!(p.create_home);
        assert_eq!(p.home.as_c_str(), USER_HOME);
        assert_eq!(p.argv, [c"ls".to_owned(), c"-l".to_owned()]);
    }

    #[test]
    fn root_with_tty() {
        let req = ExecRequest {
            uid: 0,
            gid: 0,
            tty: true,
            ..request()
        };
        let p = prepare(&req).unwrap();
        assert_eq!(
            pairs(&p.env),
            [
                ("PATH", PATH_VALUE),
                ("HOME", "/root"),
                ("TERM", "xterm-256color")
            ]
        );
        assert!(!p.create_home);
    }

    #[test]
    fn request_env_wins_and_last_duplicate_wins() {
        let req = ExecRequest {
            tty: true,
            env: vec![
                ("TERM".into(), "screen".into()),
                ("A".into(), "1".into()),
                ("PATH".into(), "/bin".into()),
                ("A".into(), "2=two".into()),
                ("EMPTY".into(), String::new()),
            ],
            ..request()
        };
        let p = prepare(&req).unwrap();
        assert_eq!(
            pairs(&p.env),
            [
                ("PATH", "/bin"),
                ("HOME", "/run/home"),
                ("TERM", "screen"),
                ("A", "2=two"),
                ("EMPTY", "")
            ]
        );
    }

    #[test]
    fn bad_requests() {
        let bad = |req: ExecRequest| prepare(&req).unwrap_err();
        assert_eq!(
            bad(ExecRequest {
                argv: vec![],
                ..request()
            }),
            RequestError::EmptyArgv
        );
        assert_eq!(
            bad(ExecRequest {
                argv: vec![String::new(), "x".into()],
                ..request()
            }),
            RequestError::EmptyArgv
        );
        assert!(matches!(
            bad(ExecRequest {
                argv: vec!["a\0b".into()],
                ..request()
            }),
            RequestError::Nul { .. }
        ));
        assert!(matches!(
            bad(ExecRequest {
                cwd: "/\0".into(),
                ..request()
            }),
            RequestError::Nul { .. }
        ));
        assert_eq!(
            bad(ExecRequest {
                env: vec![("A=B".into(), "c".into())],
                ..request()
            }),
            RequestError::EnvName("A=B".into())
        );
        assert_eq!(
            bad(ExecRequest {
                env: vec![(String::new(), "c".into())],
                ..request()
            }),
            RequestError::EnvName(String::new())
        );
        assert!(matches!(
            bad(ExecRequest {
                env: vec![("A".into(), "\0".into())],
                ..request()
            }),
            RequestError::Nul { .. }
        ));
    }

    #[test]
    fn empty_arguments_after_the_first_are_fine() {
        let req = ExecRequest {
            argv: vec!["echo".into(), String::new()],
            ..request()
        };
        assert_eq!(prepare(&req).unwrap().argv.len(), 2);
    }
}
