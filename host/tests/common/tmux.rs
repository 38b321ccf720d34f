//! A real terminal for tests: a program run in a detached tmux session on a
//! server of its own, keys sent to it, its pane read back.
//!
//! A test that needs it fails when tmux is missing: a terminal test that
//! skipped would pass without testing anything (`scripts/test.sh`
//! installs tmux).

use std::path::Path;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// How long a wait for the pane may take before the test fails, showing
/// the pane: a bound against a hang, not a timing assertion.
pub const PATIENCE: Duration = Duration::from_secs(90);

/// One detached session on a private tmux server, ended when dropped.
pub struct Tmux {
    socket: String,
    session: &'static str,
    /// Holds the file the pane's shell writes its program's exit status to.
    scratch: tempfile::TempDir,
}

/// `word` quoted for `sh`.
pub fn sh_quote(word: &str) -> String {
    format!("'{}'", word.replace('\'', r"'\''"))
}

impl Tmux {
    /// A private server, not started yet.
    pub fn new() -> Self {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let socket = format!(
            "dfx-test-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        Self {
            socket,
            session: "dfx",
            scratch: tempfile::tempdir().expect("a scratch directory for the pane"),
        }
    }

    /// Where the pane's shell writes its program's exit status.
    fn status_file(&self) -> std::path::PathBuf {
        self.scratch.path().join("exit-status")
    }

    /// Run `command` (a `sh` command line) in a new detached session of
    /// `width` x `height`, kept on screen after it exits.
    ///
    /// The pane's shell writes the command's exit status to a file once it
    /// ends: some tmux servers never reap their pane's process, so the
    /// pane is never marked dead and tmux never learns that status.
    ///
    /// # Panics
    ///
    /// When tmux is not installed, or does not start.
    pub fn start(&self, command: &str, width: u16, height: u16) {
        let (width, height) = (width.to_string(), height.to_string());
        let status = sh_quote(&self.status_file().display().to_string());
        let command = format!("{command}\necho $? > {status}.part && mv {status}.part {status}");
        let out = self.run(&[
            "new-session",
            "-d",
            "-s",
            self.session,
            "-x",
            &width,
            "-y",
            &height,
            &command,
            ";",
            "set-option",
            "-t",
            self.session,
            "remain-on-exit",
            "on",
            ";",
            "set-option",
            "-t",
            self.session,
            "history-limit",
            "10000",
        ]);
        assert!(
            out.status.success(),
            "tmux did not start: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// `tmux -L <this server> args`.
    pub fn run(&self, args: &[&str]) -> Output {
        match Command::new("tmux")
            .args(["-f", "/dev/null", "-L", &self.socket])
            .args(args)
            .output()
        {
            Ok(out) => out,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => panic!(
                "tmux is not installed, and this test drives a real terminal with it: install \
                 tmux (`apt-get install -y tmux`; scripts/test.sh does)"
            ),
            Err(err) => panic!("cannot run tmux: {err}"),
        }
    }

    /// The `tmux` command line addressing this server, for a program in the
    /// pane that must talk to it (`wait-for`).
    pub fn client(&self) -> String {
        format!("tmux -f /dev/null -L {}", self.socket)
    }

    /// Type `text`, then Enter.
    pub fn send_line(&self, text: &str) {
        // tmux reads an argument ending in `;` as the end of its command
        // and drops the `;`: the statement would never end.
        let text = match text.strip_suffix(';') {
            Some(head) => format!("{head}\\;"),
            None => text.to_string(),
        };
        let typed = self.run(&["send-keys", "-t", self.session, "-l", "--", &text]);
        assert!(typed.status.success(), "tmux send-keys failed");
        let entered = self.run(&["send-keys", "-t", self.session, "Enter"]);
        assert!(entered.status.success(), "tmux send-keys Enter failed");
    }

    /// Everything the pane showed, its scrollback included, wrapped lines
    /// joined.
    pub fn capture(&self) -> String {
        let out = self.run(&["capture-pane", "-p", "-J", "-S", "-", "-t", self.session]);
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Copy every byte the pane's program writes from now on into `file`,
    /// lines it erases included.
    pub fn log_to(&self, file: &Path) {
        let command = format!("cat >> {}", sh_quote(&file.display().to_string()));
        let out = self.run(&["pipe-pane", "-o", "-t", self.session, &command]);
        assert!(out.status.success(), "tmux pipe-pane failed");
    }

    /// Wake a program in the pane waiting with `wait-for channel`.
    pub fn signal(&self, channel: &str) {
        let out = self.run(&["wait-for", "-S", channel]);
        assert!(out.status.success(), "tmux wait-for -S failed");
    }

    /// The pane once `done` holds for it; panics with the pane when it does
    /// not within [`PATIENCE`].
    pub fn wait_for(&self, what: &str, done: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let pane = self.capture();
            if done(&pane) {
                return pane;
            }
            assert!(
                Instant::now() < deadline,
                "waited {PATIENCE:?} for {what}; the pane shows:\n{pane}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The exit status of the pane's program once it has exited; panics
    /// with the pane when it has not within [`PATIENCE`].
    pub fn wait_for_exit(&self) -> i32 {
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Some(status) = self.exit_status() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "the pane's program did not end within {PATIENCE:?}; the pane shows:\n{}",
                self.capture()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The exit status of the pane's program, once it has exited; `None`
    /// while it runs.
    pub fn exit_status(&self) -> Option<i32> {
        let text = std::fs::read_to_string(self.status_file()).ok()?;
        text.trim().parse().ok()
    }

    /// The process id of the pane's shell, which runs the program and ends
    /// when it does.
    pub fn pane_pid(&self) -> u32 {
        let out = self.run(&["display-message", "-p", "-t", self.session, "#{pane_pid}"]);
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .expect("tmux names the pane's process")
    }
}

impl Default for Tmux {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        // Not through `run`: a missing tmux already failed the test, and a
        // second panic while unwinding would abort the whole test binary.
        let _ = Command::new("tmux")
            .args(["-f", "/dev/null", "-L", &self.socket, "kill-server"])
            .output();
    }
}

/// Whether process `pid` is alive (not gone, not a zombie).
pub fn alive(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    let state = stat
        .rsplit_once(") ")
        .and_then(|(_, rest)| rest.chars().next());
    state != Some('Z')
}
