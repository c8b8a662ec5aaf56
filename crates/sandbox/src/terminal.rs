//! The caller's side of a command's terminal.
//!
//! The caller's terminal is never handed into the sandbox: there the workload could chmod
//! it (Landlock does not cover chmod), change its settings for after the run, or keep
//! reading it. A command run with [`RunCommand::terminal`](crate::RunCommand) from an
//! interactive caller (stdin and stdout a terminal, capgate in its foreground) gets a
//! pseudo-terminal the init opens in the sandbox's own `devpts`, as its controlling
//! terminal (job control, Ctrl-C and Ctrl-Z act inside the sandbox, not on capgate); the
//! init passes its controlling side out, and the caller relays between the two, as
//! `ssh -t` and `docker run -it` do: its own terminal in raw mode while the command runs
//! (the pty does the line editing, echo and signals), what is typed goes in, what the
//! command writes comes out, and a change of window size ([`WindowWatch::window_changed`],
//! on `SIGWINCH`) is passed on.
//!
//! Otherwise a caller's terminal is treated like any device: output goes through a pipe
//! that capgate copies, and a command reads nothing from the caller's keyboard (its stdin
//! is `/dev/null`), so that it cannot take keys from whatever else reads the terminal (a
//! pager the output goes to, the shell of a background job).

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use rustix::termios::{OptionalActions, Termios, tcgetattr, tcgetwinsize, tcsetattr, tcsetwinsize};

/// Which of the caller's stdin, stdout and stderr are a terminal.
pub(crate) fn terminals(stdio: [BorrowedFd<'_>; 3]) -> [bool; 3] {
    stdio.map(rustix::termios::isatty)
}

/// The caller is interactive: stdin and stdout are a terminal, and capgate is in its
/// foreground (a background job, or a pipeline's feeder into a pager, must not read it).
/// The window's size, then: rows and columns (24 × 80 for a terminal that cannot tell).
pub(crate) fn interactive(stdio: [BorrowedFd<'_>; 3], is: [bool; 3]) -> Option<(u16, u16)> {
    if !(is[0] && is[1]) {
        return None;
    }
    let foreground =
        rustix::termios::tcgetpgrp(stdio[0]).is_ok_and(|group| group == rustix::process::getpgrp());
    if !foreground {
        return None;
    }
    let size = tcgetwinsize(stdio[1])
        .ok()
        .filter(|s| s.ws_row > 0 && s.ws_col > 0);
    Some((size.map_or(24, |s| s.ws_row), size.map_or(80, |s| s.ws_col)))
}

/// Whether the caller's terminal is in raw mode now (a command's terminal is relayed): a
/// line written to it then needs its own carriage return. One per process, as the
/// process's terminal is.
static RAW: AtomicBool = AtomicBool::new(false);

/// Whether capgate's terminal is in raw mode now, for a command's terminal: capgate's own
/// messages must then end their lines with `\r\n`.
pub fn caller_terminal_is_raw() -> bool {
    RAW.load(Ordering::SeqCst)
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

/// The most typed bytes kept while no command's terminal takes them.
const MAX_PENDING: usize = 64 * 1024;

/// A command's output copier: its thread, and word when it is done.
#[derive(Debug)]
struct Copier {
    thread: JoinHandle<()>,
    done: Receiver<()>,
}

/// The relay of a sandbox's terminals: one input side for the sandbox's life (the caller's
/// keyboard is read by one thread only, feeding the attached command's terminal), and an
/// output side per command's terminal, which ends when nothing inside holds it.
#[derive(Debug)]
pub(crate) struct TerminalRelay {
    /// The caller's terminal that is read (its stdin).
    keyboard: OwnedFd,
    /// Its settings before the running command's raw mode.
    saved: Mutex<Option<Termios>>,
    /// The controlling side the input goes to (the running command's).
    current: Arc<Mutex<Option<Arc<OwnedFd>>>>,
    /// Where the commands' output goes: the caller's stdout, a terminal.
    output: Arc<OwnedFd>,
    input: Option<JoinHandle<()>>,
    copiers: Vec<Copier>,
    wake: Arc<OwnedFd>,
}

impl TerminalRelay {
    /// Starts relaying between the caller's `keyboard` (stdin) and `output` (stdout).
    /// `wake` is the read end of `watch`'s pipe.
    pub(crate) fn start(
        keyboard: BorrowedFd<'_>,
        output: BorrowedFd<'_>,
        wake: OwnedFd,
        watch: &WindowWatch,
    ) -> io::Result<TerminalRelay> {
        let keyboard = keyboard.try_clone_to_owned()?;
        let output = Arc::new(output.try_clone_to_owned()?);
        let current: Arc<Mutex<Option<Arc<OwnedFd>>>> = Arc::default();
        let input = {
            let keys = keyboard.try_clone()?;
            let (current, sized_by) = (Arc::clone(&current), Arc::clone(&output));
            std::thread::Builder::new()
                .name("capgate-terminal-in".into())
                .spawn(move || relay_input(&keys, &wake, &current, &sized_by))?
        };
        Ok(TerminalRelay {
            keyboard,
            saved: Mutex::new(None),
            current,
            output,
            input: Some(input),
            copiers: Vec::new(),
            wake: Arc::clone(&watch.0),
        })
    }

    /// While a command runs, the caller's terminal passes every key on as it is typed
    /// (raw mode): the command's terminal does the line editing, echo and signals. The
    /// settings are taken anew each time, and [`TerminalRelay::cooked`] puts them back.
    pub(crate) fn raw(&self) -> io::Result<()> {
        let saved = tcgetattr(&self.keyboard)?;
        let mut raw = saved.clone();
        raw.make_raw();
        tcsetattr(&self.keyboard, OptionalActions::Drain, &raw)?;
        *self.saved.lock().unwrap_or_else(PoisonError::into_inner) = Some(saved);
        RAW.store(true, Ordering::SeqCst);
        Ok(())
    }

    /// Between commands and after the last, the caller's terminal is as it was: capgate's
    /// own messages read as usual, and Ctrl-C reaches capgate.
    pub(crate) fn cooked(&self) {
        let saved = self
            .saved
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(saved) = saved {
            let _ = tcsetattr(&self.keyboard, OptionalActions::Drain, &saved);
            RAW.store(false, Ordering::SeqCst);
        }
    }

    /// A command's terminal (its controlling side): input goes to it from now on (until
    /// [`TerminalRelay::detach`]), and its output is copied to the caller's terminal until
    /// nothing inside holds it.
    pub(crate) fn attach(&mut self, master: OwnedFd) -> io::Result<()> {
        // Copiers of commands whose terminals nobody holds any more have ended.
        self.copiers.retain(|c| !c.thread.is_finished());
        let master = Arc::new(master);
        let (reader, output) = (Arc::clone(&master), Arc::clone(&self.output));
        let (tx, done) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("capgate-terminal-out".into())
            .spawn(move || {
                relay_output(reader.as_fd(), output.as_fd());
                let _ = tx.send(());
            })?;
        self.copiers.push(Copier { thread, done });
        *self.current.lock().unwrap_or_else(PoisonError::into_inner) = Some(master);
        // The input thread watches the keyboard now, and the window may have changed since
        // the command's terminal was sized.
        let _ = rustix::io::write(&*self.wake, &[WAKE_RESIZE]);
        Ok(())
    }

    /// The command has ended: what is typed from now on waits for the next command's
    /// terminal (or stays in the caller's). Its output is waited for (briefly), so that it
    /// comes before anything the caller prints next; a process left inside holding the
    /// terminal keeps its copier going until the sandbox stops.
    pub(crate) fn detach(&self) {
        *self.current.lock().unwrap_or_else(PoisonError::into_inner) = None;
        let _ = rustix::io::write(&*self.wake, &[WAKE_RESIZE]);
        if let Some(last) = self.copiers.last() {
            let _ = last.done.recv_timeout(Duration::from_secs(2));
        }
    }

    /// Once the sandbox has stopped (nothing inside holds a terminal any more): the last
    /// output copied, the input thread ended, the caller's terminal as it was.
    pub(crate) fn finish(mut self) {
        self.end();
    }

    fn end(&mut self) {
        for copier in self.copiers.drain(..) {
            let _ = copier.thread.join();
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
/// holds its terminal any more (EIO, once what was written is read). Output the caller's
/// terminal will not take (it is gone) is read and dropped: the command must never block
/// on a terminal nobody drains.
fn relay_output(master: BorrowedFd<'_>, output: BorrowedFd<'_>) {
    let mut buf = vec![0u8; 16 * 1024];
    let mut shown = true;
    loop {
        match rustix::io::read(master, &mut buf) {
            Ok(0) => return,
            Ok(n) => shown = shown && write_all(output, &buf[..n]).is_ok(),
            Err(rustix::io::Errno::INTR) => {}
            Err(_) => return,
        }
    }
}

/// Copies what is typed to the attached command's terminal, and applies window changes,
/// until told to quit. Keys typed while no command's terminal is attached are kept (up to
/// [`MAX_PENDING`]) for the next one.
fn relay_input(
    keyboard: &OwnedFd,
    wake: &OwnedFd,
    current: &Mutex<Option<Arc<OwnedFd>>>,
    sized_by: &OwnedFd,
) {
    use rustix::event::{PollFd, PollFlags, poll};
    let mut keyboard_open = true;
    let mut pending: Vec<u8> = Vec::new();
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let attached = current
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        if let Some(master) = attached.as_ref().filter(|_| !pending.is_empty()) {
            let _ = write_all(master.as_fd(), &pending);
            pending.clear();
        }
        let (keys_ready, wake_ready) = {
            let mut fds = vec![PollFd::new(wake, PollFlags::IN)];
            if keyboard_open && attached.is_some() {
                fds.push(PollFd::new(keyboard, PollFlags::IN));
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
            if let (Some(master), Ok(size)) = (&attached, tcgetwinsize(sized_by)) {
                let _ = tcsetwinsize(&**master, size);
            }
        }
        if keys_ready {
            let n = match rustix::io::read(keyboard, &mut buf) {
                Ok(n) if n > 0 => n,
                Err(rustix::io::Errno::INTR | rustix::io::Errno::AGAIN) => continue,
                // The caller's terminal hung up: nothing more will be typed.
                _ => {
                    keyboard_open = false;
                    continue;
                }
            };
            // The command may have ended meanwhile: then the keys wait for the next.
            let now = current
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone();
            match now {
                Some(master) => {
                    let _ = write_all(master.as_fd(), &buf[..n]);
                }
                None if pending.len() + n <= MAX_PENDING => pending.extend_from_slice(&buf[..n]),
                None => {}
            }
        }
    }
}

/// Writes all of `bytes`, waiting for room when `fd` is non-blocking (a terminal shares
/// that flag with every process that has it open, so the caller's may be).
pub(crate) fn write_all(fd: BorrowedFd<'_>, mut bytes: &[u8]) -> io::Result<()> {
    use rustix::event::{PollFd, PollFlags, poll};
    while !bytes.is_empty() {
        match rustix::io::write(fd, bytes) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => bytes = &bytes[n..],
            Err(rustix::io::Errno::INTR) => {}
            Err(rustix::io::Errno::AGAIN) => {
                let mut fds = [PollFd::new(&fd, PollFlags::OUT)];
                match poll(&mut fds, None) {
                    Ok(_) | Err(rustix::io::Errno::INTR) => {}
                    Err(e) => return Err(e.into()),
                }
            }
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
