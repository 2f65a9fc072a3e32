//! Simple commands run without a shell in between (docs/ARCHITECTURE.md, "Simple commands skip bash").
//!
//! `bash -c 'python3 main.py'` parses the command, finds `python3` in PATH and, as it is the last (and only)
//! command, execs it in its own place: the program is the process bash was, with bash's environment. All
//! bash adds is its own start (an exec, the dynamic loader, its set-up; about 1 ms of a 2.5 ms round trip
//! here). For a command that is one program and its plain words, the executor does what bash would do and
//! execs the program itself, as GNU make does for recipe lines with no shell syntax:
//! - [`words`]: only letters, digits, `_./:@%+,=-` and blanks, so there is nothing for bash to expand,
//!   quote or redirect, and the first word is neither an assignment, a reserved word nor a builtin. `true`
//!   and `false` alone are run as the programs of those names, which do the same;
//! - [`find`]: the program found as bash finds it: a word with a `/` as it is, else the first PATH entry
//!   holding an executable regular file, named `ENTRY/WORD` as bash names it;
//! - the environment bash would give it: what it was given, and `PWD` (the folder, symlinks resolved, as
//!   bash's `getcwd`), `SHLVL` and `_` (the program's path). Only when nothing in it changes what bash
//!   does or passes on (see [`plain_env`]: `BASH_ENV`, exported functions, `SHELLOPTS`, the variables bash
//!   sets itself, a locale bash would warn about...). `SHLVL` is what this image's bash passes on, asked
//!   once ([`passed_shlvl`]): bash 5.2 counts itself in at its start and out again before an exec in its
//!   place (0), and a bash that does not count itself out would pass 1. Until the answer is in, and if
//!   it is neither, commands run in bash.
//!
//! Anything else runs in bash as before. So does a program that fails to exec (a script without `#!`, a
//! missing interpreter, another machine's binary): `mentis-enter` then runs `bash -c COMMAND` in the
//! environment without the three variables above, and bash meets the failure itself, with its own message
//! and exit status. The unit tests run commands both ways and compare what they print, their status and
//! their environment.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt as _;
use std::path::Path;
use std::process::Stdio;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::process::Command;

use crate::enter::{self, Priority};

/// The characters of a command that bash would run as plain words: no quoting, expansion, globbing,
/// redirection, comment or list.
fn plain_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"_./:@%+,=- \t".contains(&b)
}

/// Bash's reserved words and builtins (bash 5.2's `help` lists), `true` and `false` aside: a command
/// starting with one needs bash.
const NEEDS_BASH: &[&str] = &[
    "!",
    ".",
    ":",
    "[",
    "[[",
    "]]",
    "{",
    "}",
    "alias",
    "bg",
    "bind",
    "break",
    "builtin",
    "caller",
    "case",
    "cd",
    "command",
    "compgen",
    "complete",
    "compopt",
    "continue",
    "coproc",
    "declare",
    "dirs",
    "disown",
    "do",
    "done",
    "echo",
    "elif",
    "else",
    "enable",
    "esac",
    "eval",
    "exec",
    "exit",
    "export",
    "fc",
    "fg",
    "fi",
    "for",
    "function",
    "getopts",
    "hash",
    "help",
    "history",
    "if",
    "in",
    "jobs",
    "kill",
    "let",
    "local",
    "logout",
    "mapfile",
    "popd",
    "printf",
    "pushd",
    "pwd",
    "read",
    "readarray",
    "readonly",
    "return",
    "select",
    "set",
    "shift",
    "shopt",
    "source",
    "suspend",
    "test",
    "then",
    "time",
    "times",
    "trap",
    "type",
    "typeset",
    "ulimit",
    "umask",
    "unalias",
    "unset",
    "until",
    "wait",
    "while",
];

/// The words of `command` when it is one program and its plain words (see the module's doc).
fn words(command: &str) -> Option<Vec<&str>> {
    if !command.bytes().all(plain_char) {
        return None;
    }
    let words: Vec<&str> = command
        .split([' ', '\t'])
        .filter(|w| !w.is_empty())
        .collect();
    let first = *words.first()?;
    if first.contains('=') {
        // An assignment before a command (or alone).
        return None;
    }
    match first {
        // The builtins ignore arguments, the programs answer --help and --version: alone they are alike.
        "true" | "false" => (words.len() == 1).then_some(words),
        _ if NEEDS_BASH.contains(&first) => None,
        _ => Some(words),
    }
}

/// Whether bash would pass an environment with these names on as it is, and behave as without them:
/// none of the variables bash reads at its start (`BASH_ENV`, `BASH_FUNC_*`, `SHELLOPTS`, `BASHOPTS`,
/// `POSIXLY_CORRECT`, `ENV`, `IFS`, `EXECIGNORE`), sets or drops on the way (`PWD`, `OLDPWD`, `SHLVL`, `_`,
/// `PPID`, `RANDOM`, `SRANDOM`, `LINENO`, `OPTIND`, `HISTCMD`, `EPOCHSECONDS`, `EPOCHREALTIME`, `PS1`,
/// `PS2`, `PS4`), and no locale but C, POSIX and C.UTF-8 (another may be missing, and bash warns).
fn plain_env(env: &HashMap<OsString, OsString>) -> bool {
    const SET_OR_READ_BY_BASH: &[&str] = &[
        "SHELLOPTS",
        "POSIXLY_CORRECT",
        "ENV",
        "IFS",
        "EXECIGNORE",
        "PWD",
        "OLDPWD",
        "SHLVL",
        "_",
        "PPID",
        "RANDOM",
        "SRANDOM",
        "LINENO",
        "OPTIND",
        "HISTCMD",
        "EPOCHSECONDS",
        "EPOCHREALTIME",
        "PS1",
        "PS2",
        "PS4",
    ];
    env.iter().all(|(name, value)| {
        let name = name.as_bytes();
        if name.starts_with(b"BASH") || SET_OR_READ_BY_BASH.iter().any(|n| n.as_bytes() == name) {
            return false;
        }
        if name == b"LANG" || name.starts_with(b"LC_") {
            return matches!(
                value.as_bytes(),
                b"C" | b"POSIX" | b"C.UTF-8" | b"C.utf8" | b""
            );
        }
        true
    })
}

/// Where bash would find `word`, and the path it would exec: a word with a `/` as it is (from `dir`), else
/// `ENTRY/WORD` for the first PATH entry holding it. `None` when bash might decide otherwise than this
/// does: no PATH, a relative or empty entry before the program, or something there that is not an
/// executable regular file (bash goes on looking, or reports it).
fn find(word: &str, dir: &Path, path: Option<&OsStr>) -> Option<OsString> {
    if word.contains('/') {
        return enter::runnable(&dir.join(word))
            .is_ok()
            .then(|| word.into());
    }
    for entry in path?.as_bytes().split(|&b| b == b':') {
        if !entry.starts_with(b"/") {
            return None;
        }
        let mut candidate = OsString::from(OsStr::from_bytes(entry));
        candidate.push("/");
        candidate.push(word);
        match enter::runnable(Path::new(&candidate)) {
            Ok(()) => return Some(candidate),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(_) => return None,
        }
    }
    None
}

/// What this image's bash says of `SHLVL` (see [`passed_shlvl`]), once asked.
static SHLVL: OnceLock<Option<&'static str>> = OnceLock::new();

/// The `SHLVL` this image's bash gives a program it execs in its own place, once known (see the module's
/// doc); until then, and when bash's answer is not one this understands, `None`.
pub(crate) fn passed_shlvl() -> Option<&'static str> {
    SHLVL.get().copied().flatten()
}

/// The question to bash that [`passed_shlvl`] waits for, to the first caller (who runs it on a task it
/// owns); `None` to every later one.
pub(crate) fn ask_shlvl_once() -> Option<impl std::future::Future<Output = ()> + Send + 'static> {
    static ASKED: AtomicBool = AtomicBool::new(false);
    if SHLVL.get().is_some() || ASKED.swap(true, Ordering::Relaxed) {
        return None;
    }
    Some(async {
        let shlvl = ask_bash().await;
        tracing::debug!(?shlvl, "SHLVL bash passes to a program in its place");
        let _ = SHLVL.set(shlvl);
    })
}

/// Asks bash: it execs a second bash in its own place, which prints the `SHLVL` it then has, one more
/// than it was given (bash 5.2: `1`).
async fn ask_bash() -> Option<&'static str> {
    let mut command = enter::command(
        OsStr::new(super::process::Shell::BASH),
        Path::new("/"),
        None,
        Priority::Lowered,
    )
    .ok()?;
    command
        .arg("-c")
        .arg(r#"/bin/bash -c 'echo "$SHLVL"'"#)
        .env_clear()
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true);
    let out = tokio::time::timeout(Duration::from_secs(10), command.output())
        .await
        .ok()?
        .ok()?;
    match out.stdout.as_slice() {
        b"1\n" => Some("0"),
        b"2\n" => Some("1"),
        _ => None,
    }
}

/// A simple command's process, as bash would have started it (see the module's doc), or `None` when the
/// command needs bash. `inherited` is the environment the shell would inherit (the executor's own, less
/// what is private to it), `layers` the variables that go over it, in order (the sandbox's env, then the
/// action's); `shlvl` gives the `SHLVL` bash would pass ([`passed_shlvl`]), asked only for a simple
/// command.
pub(crate) fn command<'a>(
    shell_command: &str,
    dir: &Path,
    inherited: impl IntoIterator<Item = (OsString, OsString)>,
    layers: impl IntoIterator<Item = (&'a String, &'a String)>,
    shlvl: impl FnOnce() -> Option<&'static str>,
) -> Option<Command> {
    let words = words(shell_command)?;
    let shlvl = shlvl()?;
    let mut env: HashMap<OsString, OsString> = inherited.into_iter().collect();
    if let Some(user) = crate::identity::sandbox_user() {
        // As `enter::command` does, under the layers.
        env.insert("HOME".into(), user.home.clone().into());
    }
    env.extend(layers.into_iter().map(|(k, v)| (k.into(), v.into())));
    if !plain_env(&env) {
        return None;
    }
    let program = find(
        words[0],
        dir,
        env.get(OsStr::new("PATH")).map(OsString::as_os_str),
    )?;
    let pwd = std::fs::canonicalize(dir).ok()?;
    env.insert("PWD".into(), pwd.into());
    env.insert("SHLVL".into(), shlvl.into());
    env.insert("_".into(), program.clone());
    let shell = super::process::Shell::BASH;
    let mut command = enter::command_or_shell(
        &program,
        OsStr::new(words[0]),
        dir,
        Priority::Lowered,
        shell,
        shell_command,
    )
    .ok()?;
    command.args(&words[1..]).env_clear().envs(env);
    Some(command)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn plain_words_are_one_program_and_anything_else_needs_bash() {
        for (command, expected) in [
            ("ls", Some(vec!["ls"])),
            (
                "  python3 main.py\t--flag=1 ",
                Some(vec!["python3", "main.py", "--flag=1"]),
            ),
            (
                "./build.sh -j4 a,b x@y 50% +1 :8080",
                Some(vec![
                    "./build.sh",
                    "-j4",
                    "a,b",
                    "x@y",
                    "50%",
                    "+1",
                    ":8080",
                ]),
            ),
            (
                "pip install numpy==2.1",
                Some(vec!["pip", "install", "numpy==2.1"]),
            ),
            ("true", Some(vec!["true"])),
            ("false", Some(vec!["false"])),
        ] {
            assert_eq!(words(command), expected, "{command:?}");
        }
        for command in [
            "",
            "   ",
            "true --help",
            "false 1",
            "echo hi",
            "cd /tmp",
            "export X=1",
            "X=1 env",
            "X=1",
            "if",
            "time ls",
            ". ./env.sh",
            ":",
            "ls *.py",
            "ls ~",
            "echo $HOME",
            "ls > out",
            "ls | wc",
            "ls; ls",
            "ls && ls",
            "ls &",
            "ls 'a b'",
            "ls \"a\"",
            "ls a\\ b",
            "ls {a,b}",
            "ls #x",
            "ls\nls",
            "ls (x)",
            "ls [ab]",
            "ls !x",
            "ls `x`",
            "ls é",
        ] {
            assert_eq!(words(command), None, "{command:?}");
        }
    }

    /// What a run printed and how it ended; `env -0`'s output sorted (bash passes variables on in its own
    /// order).
    async fn run(
        mut command: Command,
        sort: bool,
    ) -> (Vec<String>, String, Option<i32>, Option<i32>) {
        use std::os::unix::process::ExitStatusExt as _;
        super::super::user_process(&mut command, false);
        let out = command.output().await.unwrap();
        let mut stdout: Vec<String> = out
            .stdout
            .split(|&b| b == if sort { 0 } else { b'\n' })
            .map(|line| String::from_utf8_lossy(line).into_owned())
            .collect();
        if sort {
            stdout.sort();
        }
        let stderr = String::from_utf8(out.stderr).unwrap();
        (stdout, stderr, out.status.code(), out.status.signal())
    }

    #[tokio::test]
    async fn a_simple_command_runs_as_it_does_in_bash_and_a_failed_exec_falls_back_to_bash() {
        use std::os::unix::fs::PermissionsExt as _;
        let tmp = tempfile::tempdir().unwrap();
        let real = tmp.path().join("real");
        std::fs::create_dir_all(real.join("sub")).unwrap();
        // The folder is reached through a symlink: PWD is the folder as getcwd names it.
        let dir = tmp.path().join("link");
        std::os::unix::fs::symlink(&real, &dir).unwrap();
        let script = |name: &str, text: &str, mode: u32| {
            let path = real.join(name);
            std::fs::write(&path, text).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        };
        let probe = "#!/bin/sh\nprintf '[%s]\\n' \"$0\" \"$@\"; pwd; echo err >&2; env | LC_ALL=C sort; exit 3\n";
        script("probe", probe, 0o755);
        script("sub/probe", probe, 0o755);
        script("noshebang", "echo \"no #! $0 $1 $SHLVL $PWD $_\"\n", 0o755);
        script("badinterp", "#!/nonexistent/interp\n", 0o755);
        script("notexec", probe, 0o644);
        script("killed", "#!/bin/sh\nkill -9 $$\n", 0o755);
        let path = format!("{}:/usr/local/bin:/usr/bin:/bin", real.display());
        let inherited = || {
            [
                ("PATH", path.as_str()),
                ("HOME", "/nowhere"),
                ("LANG", "C.UTF-8"),
                ("a-b", "1"),
            ]
            .map(|(k, v)| (OsString::from(k), OsString::from(v)))
        };
        let none: [(&String, &String); 0] = [];
        // This machine's bash (5.2) counts itself out before an exec in its place.
        let shlvl = ask_bash().await.unwrap();
        assert_eq!(shlvl, "0");
        for (command, direct) in [
            ("env -0", true),
            ("./probe a  b\t--c=d", true),
            ("probe", true),
            ("probe x", true),
            ("sub/probe y", true),
            ("true", true),
            ("false", true),
            ("./killed", true),
            ("/bin/sh -c exit", true),
            // The exec fails: mentis-enter runs bash, which reports it (or runs the script) itself.
            ("./noshebang 1", true),
            ("./badinterp", true),
            // Bash finds nothing, or something it may not run: bash from the start.
            ("nosuchcommand", false),
            ("./notexec", false),
            ("echo $0", false),
        ] {
            let fast = super::command(command, &dir, inherited(), none, || Some(shlvl));
            assert_eq!(fast.is_some(), direct, "{command:?}");
            let mut bash = enter::command(
                OsStr::new(super::super::process::Shell::BASH),
                &dir,
                Some(OsStr::new(&path)),
                Priority::Lowered,
            )
            .unwrap();
            bash.arg("-c").arg(command).env_clear().envs(inherited());
            let sort = command == "env -0";
            let expected = run(bash, sort).await;
            if let Some(fast) = fast {
                assert_eq!(run(fast, sort).await, expected, "{command:?}");
            }
            if command == "./killed" {
                assert_eq!(expected.3, Some(9));
            }
        }
    }

    #[test]
    fn an_environment_bash_would_change_or_read_needs_bash() {
        let env = |pairs: &[(&str, &str)]| -> HashMap<OsString, OsString> {
            pairs
                .iter()
                .map(|(k, v)| ((*k).into(), (*v).into()))
                .collect()
        };
        let plain = [
            ("PATH", "/usr/bin:/bin"),
            ("HOME", "/home/sandbox"),
            ("LANG", "C.UTF-8"),
        ];
        assert!(plain_env(&env(&plain)));
        assert!(plain_env(&env(&[
            ("LC_ALL", "C"),
            ("a-b", "1"),
            ("UID", "5")
        ])));
        for extra in [
            ("BASH_ENV", "/x"),
            ("BASH_FUNC_f%%", "() { :; }"),
            ("SHELLOPTS", "xtrace"),
            ("PWD", "/"),
            ("SHLVL", "3"),
            ("_", "/x"),
            ("RANDOM", "1"),
            ("PS4", "x"),
            ("LANG", "en_US.UTF-8"),
            ("LC_CTYPE", "de_DE"),
        ] {
            let mut e = env(&plain);
            e.insert(extra.0.into(), extra.1.into());
            assert!(!plain_env(&e), "{extra:?}");
        }
    }
}
