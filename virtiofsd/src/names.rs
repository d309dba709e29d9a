//! Which names in a writable share the host runs later, and so the guest
//! may not change: the rules the guard (guard.rs) applies to every entry.
//!
//! A name's class follows from its parent's class and the name alone, at
//! any depth (a nested project's `.envrc` runs as readily as the
//! workspace's own). The list follows what the host's own tools run
//! without asking: git's hooks and configuration (`core.hooksPath`,
//! `core.fsmonitor`, aliases, filters), shell start-up files, direnv,
//! editor task and launch configuration, and agent tools' commands and
//! settings. docs/security.md lists them and compares.

/// Read-only wherever they are, with everything beneath them.
pub const READ_ONLY: &[&str] = &[
    ".envrc",
    ".gitconfig",
    ".gitmodules",
    ".bashrc",
    ".bash_profile",
    ".bash_login",
    ".bash_logout",
    ".profile",
    ".zshrc",
    ".zshenv",
    ".zprofile",
    ".zlogin",
    ".ripgreprc",
    ".mcp.json",
    // Hooks a repository keeps in its tree (git's core.hooksPath, husky,
    // the pre-commit framework's local hooks): run on the next commit.
    ".githooks",
    ".husky",
    ".pre-commit-config.yaml",
    ".vscode",
    ".idea",
    ".devcontainer",
];

/// Inside a git directory (and any directory beneath it, for submodules'
/// `.git/modules/NAME/` and worktrees' `.git/worktrees/NAME/`): what git
/// runs or takes commands from.
pub const READ_ONLY_IN_GIT: &[&str] = &["hooks", "config", "config.worktree"];

/// Inside `.claude`: the commands, agents, hooks and settings an agent
/// tool runs on the host.
pub const READ_ONLY_IN_CLAUDE: &[&str] = &[
    "commands",
    "agents",
    "hooks",
    "settings.json",
    "settings.local.json",
];

/// What an entry is to the guard. Ordered from least to most guarded: an
/// inode reached by two names (a hard link) keeps the higher class.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Class {
    /// The guest may do as it likes.
    Free,
    /// Free, but beneath a `.git` directory: its children follow
    /// READ_ONLY_IN_GIT.
    InGit,
    /// A `.claude` directory: it stays where it is; its children follow
    /// READ_ONLY_IN_CLAUDE.
    Claude,
    /// A `.git` directory: it stays where it is (neither removed, renamed
    /// nor replaced); its children follow READ_ONLY_IN_GIT.
    Git,
    /// Nothing in or about it changes.
    ReadOnly,
}

impl Class {
    /// The class of `name` in a directory of class `self`; `is_dir` says
    /// whether the entry is a directory (a `.git` file, a worktree's
    /// pointer to its git directory, is read-only as a whole).
    pub fn child(self, name: &[u8], is_dir: bool) -> Class {
        let is = |list: &[&str]| list.iter().any(|n| n.as_bytes() == name);
        match self {
            Class::ReadOnly => Class::ReadOnly,
            Class::Git | Class::InGit if is(READ_ONLY_IN_GIT) => Class::ReadOnly,
            Class::Git | Class::InGit => Class::InGit,
            Class::Claude if is(READ_ONLY_IN_CLAUDE) => Class::ReadOnly,
            Class::Claude | Class::Free => {
                if is(READ_ONLY) {
                    Class::ReadOnly
                } else if name == b".git" {
                    if is_dir {
                        Class::Git
                    } else {
                        Class::ReadOnly
                    }
                } else if name == b".claude" {
                    if is_dir {
                        Class::Claude
                    } else {
                        Class::ReadOnly
                    }
                } else {
                    Class::Free
                }
            }
        }
    }

    /// Whether the name `name` in a directory of class `self` may be made,
    /// removed, or renamed from or to (whatever it is or would be).
    pub fn may_change_name(self, name: &[u8]) -> bool {
        self.child(name, true).is_free() && self.child(name, false).is_free()
    }

    /// Whether the guest may change the entry itself: its contents, its
    /// attributes, its extended attributes.
    pub fn is_free(self) -> bool {
        matches!(self, Class::Free | Class::InGit)
    }

    /// Whether the guard must remember an inode of this class: only
    /// classes that change what their children are (or are guarded
    /// themselves); a Free inode is what an unknown one is taken for.
    pub fn worth_keeping(self, is_dir: bool) -> bool {
        match self {
            Class::Free => false,
            Class::InGit => is_dir,
            Class::Claude | Class::Git | Class::ReadOnly => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Class::*;
    use super::*;

    #[test]
    fn read_only_names_at_any_depth() {
        assert_eq!(Free.child(b".envrc", false), ReadOnly);
        assert_eq!(Free.child(b".vscode", true), ReadOnly);
        assert_eq!(ReadOnly.child(b"tasks.json", false), ReadOnly);
        assert_eq!(Free.child(b"src", true), Free);
        assert_eq!(Free.child(b"envrc", false), Free);
        assert_eq!(Free.child(b".envrc.bak", false), Free);
        for name in READ_ONLY {
            assert!(!Free.may_change_name(name.as_bytes()), "{name}");
        }
        assert!(Free.may_change_name(b"main.rs"));
    }

    #[test]
    fn a_git_directory_stays_and_its_hooks_and_config_are_read_only() {
        let git = Free.child(b".git", true);
        assert_eq!(git, Git);
        assert!(!Free.may_change_name(b".git"));
        assert!(!git.is_free());
        assert_eq!(git.child(b"hooks", true), ReadOnly);
        assert_eq!(git.child(b"config", false), ReadOnly);
        assert_eq!(git.child(b"config.worktree", false), ReadOnly);
        // What a commit writes stays free.
        for name in [
            "objects",
            "refs",
            "index",
            "HEAD",
            "COMMIT_EDITMSG",
            "index.lock",
        ] {
            assert!(git.may_change_name(name.as_bytes()), "{name}");
            assert!(git.child(name.as_bytes(), false).is_free(), "{name}");
        }
        // A submodule's git directory beneath it keeps the same rules.
        let module = git.child(b"modules", true).child(b"lib", true);
        assert_eq!(module, InGit);
        assert_eq!(module.child(b"hooks", true), ReadOnly);
        assert_eq!(module.child(b"config", false), ReadOnly);
        // A worktree's .git file (gitdir: ...) is read-only as a whole.
        assert_eq!(Free.child(b".git", false), ReadOnly);
    }

    #[test]
    fn claude_settings_and_commands_are_read_only() {
        let claude = Free.child(b".claude", true);
        assert_eq!(claude, Claude);
        assert!(!Free.may_change_name(b".claude"));
        assert_eq!(claude.child(b"settings.json", false), ReadOnly);
        assert_eq!(claude.child(b"commands", true), ReadOnly);
        assert_eq!(claude.child(b"notes.md", false), Free);
        assert_eq!(claude.child(b".envrc", false), ReadOnly);
    }

    #[test]
    fn the_higher_class_wins() {
        assert!(ReadOnly > Git && Git > Claude && Claude > InGit && InGit > Free);
        assert!(!Free.worth_keeping(true));
        assert!(!InGit.worth_keeping(false));
        assert!(InGit.worth_keeping(true));
    }
}
