//! The caller's side of a command's terminal.
//!
//! The caller's terminal is never handed into the sandbox: there the workload could chmod
//! it (Landlock does not cover chmod), change its settings for after the run, or keep
//! reading it. Where the caller's stdio is a terminal, the init opens a pseudo-terminal in
//! the sandbox's own `devpts` instead, makes it the command's controlling terminal (job
//! control and Ctrl-C act inside the sandbox, not on capgate), and passes its controlling
//! side out. The caller relays between the two, as `ssh -t` and `docker run -it` do: what
//! is typed goes in, with the caller's terminal in raw mode while the sandbox runs (its
//! own line discipline is the pty's), and what the command writes comes out. A change of
//! window size ([`WindowWatch::window_changed`], on `SIGWINCH`) is passed on.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;

use rustix::termios::{OptionalActions, Termios, tcgetattr, tcgetwinsize, tcsetattr, tcsetwinsize};

/// What the caller's stdio says about terminals: which of stdin, stdout and stderr are
/// one, and the window's size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CallerTerminal {
    pub stdio: [bool; 3],
    pub rows: u16,
    pub cols: u16,
}

impl CallerTerminal {
    /// `None` when none of the three is a terminal.
    pub(crate) fn of(stdio: [BorrowedFd<'_>; 3]) -> Option<CallerTerminal> {
        let is = stdio.map(rustix::termios::isatty);
        let first = stdio
            .iter()
            .zip(is)
            .find_map(|(fd, is)| is.then_some(*fd))?;
        // A terminal that cannot tell its size (a serial line) starts at 24 × 80.
        let size = tcgetwinsize(first)
            .ok()
            .filter(|s| s.ws_row > 0 && s.ws_col > 0);
        Some(CallerTerminal {
            stdio: is,
            rows: size.map_or(24, |s| s.ws_row),
            cols: size.map_or(80, |s| s.ws_col),
        })
    }
}

/// Tells the relay that the caller's window changed size (from a `SIGWINCH` handler's
/// thread); the command's terminal takes the new size, and its foreground gets `SIGWINCH`.
#[derive(Debug, Clone)]
pub struct WindowWatch(Arc<OwnedFd>);

impl WindowWatch {
    /// Passes the caller's window size on to the command's terminal, if one is relayed.
    pub fn window_changed(&self) {
        // A full pipe already holds a wake-up: the size is read when it is handled.
        let _ = rustix::io::write(&*self.0, &[WAKE_RESIZE]);
    }
}

const WAKE_RESIZE: u8 = b'r';
const WAKE_QUIT: u8 = b'q';

/// The relay of a sandbox's terminals: one input side for the sandbox's life (the caller's
/// terminal is read by one thread only, feeding the newest command's terminal), and an
/// output side per command's terminal, which ends when nothing inside holds that terminal.
#[derive(Debug)]
pub(crate) struct TerminalRelay {
    /// The caller's terminal that is read (its stdin), and its settings before raw mode.
    keyboard: Option<(OwnedFd, Termios)>,
    /// The controlling side the input goes to (the newest command's).
    current: Arc<Mutex<Option<Arc<OwnedFd>>>>,
    /// Where the commands' output goes: the caller's terminal.
    output: Arc<OwnedFd>,
    input: Option<JoinHandle<()>>,
    outputs: Vec<JoinHandle<()>>,
    wake: Arc<OwnedFd>,
}

impl TerminalRelay {
    /// Starts relaying for the caller's `stdio`, of which `terminal` says which are
    /// terminals. `wake` is the read end of `watch`'s pipe.
    pub(crate) fn start(
        stdio: [BorrowedFd<'_>; 3],
        terminal: &CallerTerminal,
        wake: OwnedFd,
        watch: &WindowWatch,
    ) -> io::Result<TerminalRelay> {
        // Output to stdout if it is the terminal, else stderr, else stdin's terminal.
        let out = [1, 2, 0]
            .into_iter()
            .find(|&i| terminal.stdio[i])
            .ok_or_else(|| io::Error::other("no terminal among the caller's stdio"))?;
        let output = Arc::new(stdio[out].try_clone_to_owned()?);
        let keyboard = if terminal.stdio[0] {
            let fd = stdio[0].try_clone_to_owned()?;
            let saved = tcgetattr(&fd)?;
            Some((fd, saved))
        } else {
            None
        };
        let current: Arc<Mutex<Option<Arc<OwnedFd>>>> = Arc::default();
        let input = {
            let keys = keyboard
                .as_ref()
                .map(|(fd, _)| fd.try_clone())
                .transpose()?;
            let (current, sized_by) = (Arc::clone(&current), Arc::clone(&output));
            std::thread::Builder::new()
                .name("capgate-terminal-in".into())
                .spawn(move || relay_input(keys, &wake, &current, &sized_by))?
        };
        Ok(TerminalRelay {
            keyboard,
            current,
            output,
            input: Some(input),
            outputs: Vec::new(),
            wake: Arc::clone(&watch.0),
        })
    }

    /// While a command runs, the caller's terminal passes every key on as it is typed
    /// (raw mode): the command's terminal does the line editing, echo and signals.
    pub(crate) fn raw(&self) -> io::Result<()> {
        if let Some((fd, saved)) = &self.keyboard {
            let mut raw = saved.clone();
            raw.make_raw();
            tcsetattr(fd, OptionalActions::Drain, &raw)?;
        }
        Ok(())
    }

    /// Between commands and after the last, the caller's terminal is as it was: capgate's
    /// own messages read as usual, and Ctrl-C reaches capgate.
    pub(crate) fn cooked(&self) {
        if let Some((fd, saved)) = &self.keyboard {
            let _ = tcsetattr(fd, OptionalActions::Drain, saved);
        }
    }

    /// A command's terminal (its controlling side): input goes to it from now on (until
    /// [`TerminalRelay::detach`]), and its output is copied to the caller's terminal until
    /// nothing inside holds it.
    pub(crate) fn attach(&mut self, master: OwnedFd) -> io::Result<()> {
        let master = Arc::new(master);
        let reader = Arc::clone(&master);
        let output = Arc::clone(&self.output);
        let copier = std::thread::Builder::new()
            .name("capgate-terminal-out".into())
            .spawn(move || relay_output(reader.as_fd(), output.as_fd()))?;
        self.outputs.push(copier);
        *self.current.lock().unwrap_or_else(PoisonError::into_inner) = Some(master);
        // The window may have changed since the command's terminal was sized.
        let _ = rustix::io::write(&*self.wake, &[WAKE_RESIZE]);
        Ok(())
    }

    /// The command has ended: what is typed from now on waits in the caller's terminal
    /// for the next command's.
    pub(crate) fn detach(&self) {
        *self.current.lock().unwrap_or_else(PoisonError::into_inner) = None;
        // The input thread stops watching the keyboard.
        let _ = rustix::io::write(&*self.wake, &[WAKE_RESIZE]);
    }

    /// Once the sandbox has stopped (nothing inside holds a terminal any more): the last
    /// output copied, the input thread ended, the caller's terminal as it was.
    pub(crate) fn finish(mut self) {
        self.end();
    }

    fn end(&mut self) {
        for copier in self.outputs.drain(..) {
            let _ = copier.join();
        }
        let _ = rustix::io::write(&*self.wake, &[WAKE_QUIT]);
        if let Some(input) = self.input.take() {
            let _ = input.join();
        }
        self.cooked();
    }
}

impl Drop for TerminalRelay {
    fn drop(&mut self) {
        self.end();
    }
}

/// Copies a command's output to the caller's terminal until the pty says that nothing
/// holds its terminal any more (EIO, once what was written is read), or the caller's
/// terminal is gone.
fn relay_output(master: BorrowedFd<'_>, output: BorrowedFd<'_>) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        match rustix::io::read(master, &mut buf) {
            Ok(0) => return,
            Ok(n) => {
                if write_all(output, &buf[..n]).is_err() {
                    return;
                }
            }
            Err(rustix::io::Errno::INTR) => {}
            Err(_) => return,
        }
    }
}

/// Copies what is typed (when the caller's stdin is a terminal) to the attached command's
/// terminal, and applies window changes, until told to quit. Nothing is read while no
/// command's terminal is attached: keys typed ahead wait for the command.
fn relay_input(
    keyboard: Option<OwnedFd>,
    wake: &OwnedFd,
    current: &Mutex<Option<Arc<OwnedFd>>>,
    sized_by: &OwnedFd,
) {
    use rustix::event::{PollFd, PollFlags, poll};
    let mut keyboard = keyboard;
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let attached = current
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some();
        let (keys_ready, wake_ready) = {
            let mut fds = vec![PollFd::new(wake, PollFlags::IN)];
            if let Some(k) = keyboard.as_ref().filter(|_| attached) {
                fds.push(PollFd::new(k, PollFlags::IN));
            }
            match poll(&mut fds, None) {
                Ok(_) => {}
                Err(rustix::io::Errno::INTR) => continue,
                Err(_) => return,
            }
            let ready = |f: &PollFd<'_>| !f.revents().is_empty();
            (fds.get(1).is_some_and(ready), ready(&fds[0]))
        };
        if wake_ready {
            let mut got = [0u8; 64];
            let n = match rustix::io::read(wake, &mut got) {
                Ok(n) => n,
                Err(rustix::io::Errno::INTR | rustix::io::Errno::AGAIN) => continue,
                Err(_) => 0,
            };
            // Every `WindowWatch` dropped, or told to quit.
            if n == 0 || got[..n].contains(&WAKE_QUIT) {
                return;
            }
            let master = current
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone();
            if let (Some(master), Ok(size)) = (master, tcgetwinsize(sized_by)) {
                let _ = tcsetwinsize(&*master, size);
            }
        }
        if keys_ready && let Some(k) = &keyboard {
            let n = match rustix::io::read(k, &mut buf) {
                Ok(n) if n > 0 => n,
                Err(rustix::io::Errno::INTR | rustix::io::Errno::AGAIN) => continue,
                // The caller's terminal hung up: nothing more will be typed.
                _ => {
                    keyboard = None;
                    continue;
                }
            };
            let master = current
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone();
            if let Some(master) = master {
                let _ = write_all(master.as_fd(), &buf[..n]);
            }
        }
    }
}

fn write_all(fd: BorrowedFd<'_>, mut bytes: &[u8]) -> io::Result<()> {
    while !bytes.is_empty() {
        match rustix::io::write(fd, bytes) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => bytes = &bytes[n..],
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// The pipe behind a [`WindowWatch`]: its read end for the relay. Non-blocking, so that a
/// signal handler's thread never waits on it.
pub(crate) fn window_pipe() -> io::Result<(OwnedFd, WindowWatch)> {
    use rustix::pipe::{PipeFlags, pipe_with};
    let (read, write) = pipe_with(PipeFlags::CLOEXEC | PipeFlags::NONBLOCK)?;
    Ok((read, WindowWatch(Arc::new(write))))
}
