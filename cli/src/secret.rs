//! `mentis secret ...`: a space's secrets (SpaceService.SetSecret, ListSecrets, DeleteSecret;
//! docs/EGRESS.md, "Secrets"). A value is read from stdin, never from an argument, so that it stays out of
//! shell history and process lists; no call gives it back.

use std::io::{BufRead, IsTerminal};

use anyhow::Context as _;
use clap::Subcommand;
use mentis_proto::api;
use rustix::termios::{self, LocalModes, OptionalActions, Termios};
use serde_json::{Value, json};
use tokio::signal::unix::{SignalKind, signal};

use crate::client::Conn;
use crate::error::{Result, Status};
use crate::output::{self, Format};

#[derive(Subcommand, Debug)]
pub enum SecretCommand {
    /// Set a secret (made or replaced) to the value on stdin, never an argument (text: the name).
    ///
    /// One trailing newline is dropped: `printf %s "$TOKEN" | mentis secret set API_TOKEN`, or
    /// `mentis secret set API_TOKEN < token.txt`. From a terminal, one line is read without echo. Rules name
    /// it as `{secret:NAME}` in a header's value.
    Set {
        /// Letters, digits and '_', not starting with a digit, at most 64.
        name: String,
        /// The space (default: `default`).
        #[arg(long, default_value = "", hide_default_value = true)]
        space: String,
    },
    /// List a space's secrets: their names, never their values.
    #[command(alias = "list")]
    Ls {
        /// The space (default: `default`).
        #[arg(long, default_value = "", hide_default_value = true)]
        space: String,
    },
    /// Delete a secret; requests of rules that name it are refused from then on (text: the name).
    #[command(alias = "delete")]
    Rm {
        name: String,
        /// The space (default: `default`).
        #[arg(long, default_value = "", hide_default_value = true)]
        space: String,
    },
}

pub async fn run(conn: &Conn, cmd: SecretCommand, format: Format) -> Result<Status> {
    let mut c = conn.spaces();
    match cmd {
        SecretCommand::Set { name, space } => {
            let Some(value) = read_value(&name).await? else {
                return Ok(INTERRUPTED);
            };
            c.set_secret(api::SetSecretRequest {
                space_id: space.clone(),
                name: name.clone(),
                value,
            })
            .await?;
            match format {
                Format::Json => output::print_json(&json!({
                    "space_id": space_or_default(&space),
                    "name": name,
                    "set": true,
                })),
                Format::Text => println!("{name}"),
            }
        }
        SecretCommand::Ls { space } => {
            let names = c
                .list_secrets(api::ListSecretsRequest { space_id: space })
                .await?
                .into_inner()
                .names;
            match format {
                Format::Json => output::print_json(&Value::Array(
                    names.into_iter().map(Value::String).collect(),
                )),
                Format::Text => output::table(
                    &["NAME"],
                    &names.into_iter().map(|n| vec![n]).collect::<Vec<_>>(),
                ),
            }
        }
        SecretCommand::Rm { name, space } => {
            c.delete_secret(api::DeleteSecretRequest {
                space_id: space.clone(),
                name: name.clone(),
            })
            .await?;
            match format {
                Format::Json => output::print_json(&json!({
                    "space_id": space_or_default(&space),
                    "name": name,
                    "deleted": true,
                })),
                Format::Text => println!("{name}"),
            }
        }
    }
    Ok(0)
}

/// The status after a Ctrl-C at the prompt (128 + SIGINT).
const INTERRUPTED: Status = 130;

fn space_or_default(space: &str) -> &str {
    if space.is_empty() { "default" } else { space }
}

/// The value on stdin: all of it from a pipe or file, one line from a terminal (typed without echo);
/// one trailing newline dropped. None when Ctrl-C ended the prompt.
async fn read_value(name: &str) -> Result<Option<String>> {
    let bytes = if std::io::stdin().is_terminal() {
        // Caught before the echo goes off, so that a Ctrl-C puts it back.
        let mut interrupt = signal(SignalKind::interrupt())?;
        eprint!("Value of {name} (not shown): ");
        let echo_off = EchoOff::enable().context("turning the terminal's echo off")?;
        // Its owner: a Ctrl-C leaves the read blocked until the process ends.
        let mut reader = tokio::task::JoinSet::new();
        reader.spawn_blocking(|| {
            let mut line = Vec::new();
            std::io::stdin()
                .lock()
                .read_until(b'\n', &mut line)
                .map(|_| line)
        });
        let line = tokio::select! {
            line = reader.join_next() => match line {
                Some(Ok(read)) => read.context("reading the terminal")?,
                _ => return Err(anyhow::anyhow!("the terminal's reader ended without a line").into()),
            },
            _ = interrupt.recv() => {
                drop(echo_off);
                eprintln!();
                return Ok(None);
            }
        };
        drop(echo_off);
        eprintln!();
        line
    } else {
        let mut buf = Vec::new();
        tokio::io::AsyncReadExt::read_to_end(&mut tokio::io::stdin(), &mut buf)
            .await
            .context("reading stdin")?;
        buf
    };
    let value = String::from_utf8(bytes).context("the value on stdin is not UTF-8 text")?;
    Ok(Some(without_newline(value)))
}

/// `value` less one trailing newline (`\n` or `\r\n`).
fn without_newline(mut value: String) -> String {
    if value.ends_with('\n') {
        value.pop();
        if value.ends_with('\r') {
            value.pop();
        }
    }
    value
}

/// The terminal on stdin without echo while this lives; its settings are put back when it is dropped.
struct EchoOff {
    saved: Termios,
}

impl EchoOff {
    fn enable() -> std::io::Result<Self> {
        let stdin = std::io::stdin();
        let saved = termios::tcgetattr(&stdin)?;
        let mut quiet = saved.clone();
        quiet.local_modes.remove(LocalModes::ECHO);
        termios::tcsetattr(&stdin, OptionalActions::Now, &quiet)?;
        Ok(Self { saved })
    }
}

impl Drop for EchoOff {
    fn drop(&mut self) {
        let _ = termios::tcsetattr(std::io::stdin(), OptionalActions::Now, &self.saved);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_trailing_newline_is_dropped() {
        for (given, kept) in [
            ("tok", "tok"),
            ("tok\n", "tok"),
            ("tok\r\n", "tok"),
            ("tok\n\n", "tok\n"),
            ("a b\tc", "a b\tc"),
            ("\n", ""),
            ("", ""),
        ] {
            assert_eq!(without_newline(given.to_owned()), kept, "{given:?}");
        }
    }
}
