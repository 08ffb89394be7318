//! The lifecycle of one supervised server as an explicit state machine, with no I/O: inputs
//! (what the log, HTTP, signals and the clock said) go in, [`Action`]s (what to do to the child
//! and what to record) come out. Every transition is in [`Machine::on`] and [`Machine::tick`];
//! the driver in `lifecycle::run` carries the actions out. Tests drive it as a fake child would.
use crate::events::{Event, SignalTarget};
use crate::exit;
use crate::readiness::{self, Evidence};
use std::time::{Duration, Instant};

/// After a fatal line, how long the child may take to end itself before we kill its tree (it
/// often does within milliseconds, and its own status is the truer one).
pub const FATAL_SELF_EXIT: Duration = Duration::from_millis(300);

/// Why we are stopping the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// A signal we were sent (and forwarded).
    Requested(i32),
    /// A fatal line before readiness.
    Fatal,
    ReadyTimeout,
}

/// Where the readiness check stands while starting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Probe {
    /// Waiting for the log: the ready line (node rank 0), or every local rank's last phase.
    Waiting,
    /// The next check is due at this time.
    Due { at: Instant, evidence: Evidence },
    /// A check is under way.
    InFlight { evidence: Evidence },
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum State {
    Starting {
        probe: Probe,
    },
    Ready {
        at: Instant,
    },
    Stopping {
        why: Stop,
        /// When the tree gets SIGKILL (`None`: already sent).
        kill_at: Option<Instant>,
        /// We SIGKILLed a server that was still alive (it had not ended itself on a fatal).
        killed_live: bool,
    },
}

/// What happened.
#[derive(Debug, Clone, PartialEq)]
pub enum Input {
    /// The log printed `The server is fired up and ready to roll!`.
    ReadyLine,
    /// Every local scheduler rank logged its last startup phase (node rank >= 1).
    RanksSettled,
    /// A readiness check answered.
    Checked(Result<&'static str, String>),
    /// We were sent this signal.
    Signal(i32),
    /// A fatal line in the log.
    Fatal,
}

/// What to do.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Run one readiness check.
    Check(Evidence),
    /// Send a signal (negative `dest`: a process group).
    Send {
        dest: i32,
        sig: i32,
    },
    /// SIGKILL the whole tree; `note_live`: record whether the server was still alive.
    KillTree {
        note_live: bool,
    },
    /// The server is ready: record it and start what follows readiness.
    BecomeReady,
    /// `--ready-timeout` passed: say where each rank stopped.
    ReadyTimedOut,
    /// The log said ready but HTTP does not confirm it: from now on, polling.
    Unconfirmed(String),
    Emit(Event),
}

/// The settings the machine needs.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    pub pid: i32,
    pub grace: Duration,
    pub signal_group: bool,
    /// `--ready-on http`: poll from the start, ignore the ready line.
    pub poll_from_start: bool,
    pub node: readiness::Node,
    pub ready_deadline: Instant,
}

pub struct Machine {
    pub state: State,
    settings: Settings,
    /// Until when a ready line is confirmed at the fast pace.
    confirm_until: Option<Instant>,
}

impl Machine {
    pub fn new(settings: Settings, now: Instant) -> Self {
        let probe = if settings.poll_from_start {
            Probe::Due {
                at: now,
                evidence: Evidence::None,
            }
        } else {
            Probe::Waiting
        };
        Machine {
            state: State::Starting { probe },
            settings,
            confirm_until: None,
        }
    }

    pub fn is_ready(&self) -> bool {
        matches!(self.state, State::Ready { .. })
    }

    pub fn stop(&self) -> Option<Stop> {
        match self.state {
            State::Stopping { why, .. } => Some(why),
            _ => None,
        }
    }

    /// The next time [`Machine::tick`] has something to do.
    pub fn deadline(&self) -> Option<Instant> {
        match self.state {
            State::Starting { probe } => Some(match probe {
                Probe::Due { at, .. } => at.min(self.settings.ready_deadline),
                _ => self.settings.ready_deadline,
            }),
            State::Ready { .. } => None,
            State::Stopping { kill_at, .. } => kill_at,
        }
    }

    /// The clock moved: whatever is due.
    pub fn tick(&mut self, now: Instant) -> Vec<Action> {
        match self.state {
            State::Starting { .. } if now >= self.settings.ready_deadline => {
                let mut out = vec![Action::ReadyTimedOut];
                out.extend(self.begin_stop(Stop::ReadyTimeout, libc::SIGTERM, now));
                out
            }
            State::Starting {
                probe: Probe::Due { at, evidence },
            } if now >= at => {
                self.state = State::Starting {
                    probe: Probe::InFlight { evidence },
                };
                vec![Action::Check(evidence)]
            }
            State::Stopping {
                why,
                kill_at: Some(at),
                killed_live,
            } if now >= at => {
                self.state = State::Stopping {
                    why,
                    kill_at: None,
                    killed_live,
                };
                vec![Action::KillTree {
                    note_live: why == Stop::Fatal,
                }]
            }
            _ => Vec::new(),
        }
    }

    pub fn on(&mut self, input: Input, now: Instant) -> Vec<Action> {
        match (self.state, input) {
            (State::Stopping { .. }, Input::Signal(sig)) => {
                // A second signal (or one during a stop of ours): no more waiting.
                if let State::Stopping { kill_at, .. } = &mut self.state {
                    *kill_at = None;
                }
                vec![
                    Action::Emit(Event::Signal {
                        signal: signal_name(sig).into(),
                        target: SignalTarget::Tree,
                    }),
                    Action::KillTree { note_live: false },
                ]
            }
            (_, Input::Signal(sig)) => {
                let target = if self.settings.signal_group {
                    SignalTarget::Group
                } else {
                    SignalTarget::Main
                };
                let mut out = self.begin_stop(Stop::Requested(sig), sig, now);
                out.push(Action::Emit(Event::Signal {
                    signal: signal_name(sig).into(),
                    target,
                }));
                out
            }
            (State::Starting { probe }, Input::ReadyLine) => {
                if self.settings.poll_from_start || self.settings.node.serves_no_api() {
                    return Vec::new();
                }
                match probe {
                    Probe::Waiting => {
                        self.confirm_until = Some(now + readiness::CONFIRM_FOR);
                        self.state = State::Starting {
                            probe: Probe::InFlight {
                                evidence: Evidence::ReadyLine,
                            },
                        };
                        vec![Action::Check(Evidence::ReadyLine)]
                    }
                    _ => Vec::new(),
                }
            }
            (
                State::Starting {
                    probe: Probe::Waiting,
                },
                Input::RanksSettled,
            ) if self.settings.node.serves_no_api() => {
                self.state = State::Starting {
                    probe: Probe::InFlight {
                        evidence: Evidence::None,
                    },
                };
                vec![Action::Check(Evidence::None)]
            }
            (
                State::Starting {
                    probe: Probe::InFlight { evidence },
                },
                Input::Checked(answer),
            ) => match answer {
                Ok(_) => {
                    self.state = State::Ready { at: now };
                    vec![Action::BecomeReady]
                }
                Err(why) => {
                    let confirming = self.confirm_until.is_some_and(|until| now < until);
                    let (next, evidence, mut out) = match evidence {
                        Evidence::ReadyLine if confirming => {
                            (readiness::CONFIRM_PERIOD, evidence, Vec::new())
                        }
                        // Past the confirmation window the ready line is no longer trusted.
                        Evidence::ReadyLine => (
                            Duration::ZERO,
                            Evidence::None,
                            vec![Action::Unconfirmed(why)],
                        ),
                        Evidence::None => (readiness::POLL_PERIOD, evidence, Vec::new()),
                    };
                    self.state = State::Starting {
                        probe: Probe::Due {
                            at: now + next,
                            evidence,
                        },
                    };
                    out.extend(self.tick(now));
                    out
                }
            },
            (State::Starting { .. }, Input::Fatal) => {
                self.state = State::Stopping {
                    why: Stop::Fatal,
                    kill_at: Some(now + FATAL_SELF_EXIT),
                    killed_live: false,
                };
                Vec::new()
            }
            _ => Vec::new(),
        }
    }

    /// After a `KillTree { note_live: true }`: whether the server was still alive then.
    pub fn note_killed_live(&mut self, alive: bool) {
        if let State::Stopping { killed_live, .. } = &mut self.state {
            *killed_live = alive;
        }
    }

    /// Forward `sig` to the server and give it `--grace` to end. SIGCONT follows: a stopped
    /// (SIGSTOPped) server would otherwise sit on the signal for the whole grace.
    fn begin_stop(&mut self, why: Stop, sig: i32, now: Instant) -> Vec<Action> {
        self.state = State::Stopping {
            why,
            kill_at: Some(now + self.settings.grace),
            killed_live: false,
        };
        let dest = if self.settings.signal_group {
            -self.settings.pid
        } else {
            self.settings.pid
        };
        vec![
            Action::Send { dest, sig },
            Action::Send {
                dest,
                sig: libc::SIGCONT,
            },
        ]
    }

    /// Whether the stop was asked for by a signal.
    pub fn requested(&self) -> bool {
        matches!(self.stop(), Some(Stop::Requested(_)))
    }

    /// `run`'s exit status, given how the server itself ended.
    pub fn exit_status(&self, child_shell_code: i32) -> i32 {
        match self.state {
            State::Stopping {
                why: Stop::Requested(sig),
                ..
            } => exit::signalled(sig),
            State::Stopping {
                why: Stop::ReadyTimeout,
                ..
            } => exit::TIMEOUT,
            State::Stopping {
                why: Stop::Fatal,
                killed_live: true,
                ..
            } => exit::STOPPED_ON_FATAL,
            _ => child_shell_code,
        }
    }
}

pub fn signal_name(sig: i32) -> &'static str {
    match sig {
        libc::SIGINT => "SIGINT",
        libc::SIGTERM => "SIGTERM",
        libc::SIGHUP => "SIGHUP",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGKILL => "SIGKILL",
        libc::SIGUSR1 => "SIGUSR1",
        libc::SIGUSR2 => "SIGUSR2",
        libc::SIGALRM => "SIGALRM",
        libc::SIGWINCH => "SIGWINCH",
        libc::SIGPIPE => "SIGPIPE",
        _ => "signal",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::readiness::Node;

    const PID: i32 = 4242;

    fn machine(poll_from_start: bool, node: Node) -> (Machine, Instant) {
        let t0 = Instant::now();
        let m = Machine::new(
            Settings {
                pid: PID,
                grace: Duration::from_secs(30),
                signal_group: false,
                poll_from_start,
                node,
                ready_deadline: t0 + Duration::from_secs(600),
            },
            t0,
        );
        (m, t0)
    }

    fn secs(t: Instant, s: f64) -> Instant {
        t + Duration::from_secs_f64(s)
    }

    #[test]
    fn the_ready_line_is_confirmed_by_one_check_then_ready() {
        let (mut m, t0) = machine(false, Node::default());
        assert_eq!(
            m.deadline(),
            Some(secs(t0, 600.0)),
            "only the ready timeout"
        );
        assert_eq!(
            m.on(Input::ReadyLine, t0),
            vec![Action::Check(Evidence::ReadyLine)]
        );
        assert!(
            m.on(Input::ReadyLine, t0).is_empty(),
            "a second ready line (one per worker) starts no second check"
        );
        assert_eq!(
            m.on(Input::Checked(Ok("/ready")), secs(t0, 0.01)),
            vec![Action::BecomeReady]
        );
        assert!(m.is_ready());
        assert_eq!(m.deadline(), None);
    }

    #[test]
    fn an_unconfirmed_ready_line_retries_fast_then_falls_back_to_polling() {
        let (mut m, t0) = machine(false, Node::default());
        m.on(Input::ReadyLine, t0);
        assert!(m
            .on(
                Input::Checked(Err("GET /ready answered 503".into())),
                secs(t0, 0.1)
            )
            .is_empty());
        assert_eq!(m.deadline(), Some(secs(t0, 0.2)), "retried within 100 ms");
        assert_eq!(
            m.tick(secs(t0, 0.2)),
            vec![Action::Check(Evidence::ReadyLine)]
        );
        // Past the 5 s window: one `Unconfirmed`, then a check without the log's evidence.
        let acts = m.on(Input::Checked(Err("refused".into())), secs(t0, 6.0));
        assert_eq!(
            acts,
            vec![
                Action::Unconfirmed("refused".into()),
                Action::Check(Evidence::None)
            ]
        );
        m.on(Input::Checked(Err("503".into())), secs(t0, 7.0));
        assert_eq!(m.deadline(), Some(secs(t0, 8.0)), "then once a second");
    }

    #[test]
    fn a_worker_node_waits_for_its_ranks_then_health() {
        let (mut m, t0) = machine(false, Node { rank: 1, nnodes: 2 });
        assert!(
            m.on(Input::ReadyLine, t0).is_empty(),
            "node rank >= 1 has no ready line"
        );
        assert_eq!(
            m.on(Input::RanksSettled, secs(t0, 1.0)),
            vec![Action::Check(Evidence::None)]
        );
        m.on(Input::Checked(Err("refused".into())), secs(t0, 1.1));
        assert_eq!(m.tick(secs(t0, 2.1)), vec![Action::Check(Evidence::None)]);
        assert_eq!(
            m.on(Input::Checked(Ok("/health")), secs(t0, 2.2)),
            vec![Action::BecomeReady]
        );
    }

    #[test]
    fn sigterm_is_forwarded_with_sigcont_and_the_grace_ends_in_sigkill() {
        let (mut m, t0) = machine(false, Node::default());
        let acts = m.on(Input::Signal(libc::SIGTERM), t0);
        assert_eq!(
            acts[..2],
            [
                Action::Send {
                    dest: PID,
                    sig: libc::SIGTERM
                },
                Action::Send {
                    dest: PID,
                    sig: libc::SIGCONT
                }
            ]
        );
        assert!(matches!(
            &acts[2],
            Action::Emit(Event::Signal {
                target: SignalTarget::Main,
                ..
            })
        ));
        assert!(m.tick(secs(t0, 29.0)).is_empty());
        assert_eq!(
            m.tick(secs(t0, 30.0)),
            vec![Action::KillTree { note_live: false }]
        );
        assert_eq!(
            m.exit_status(137),
            143,
            "a requested stop is 128 + its signal"
        );
        assert!(m.requested());
    }

    #[test]
    fn a_second_signal_kills_the_tree_at_once() {
        let (mut m, t0) = machine(false, Node::default());
        m.on(Input::Signal(libc::SIGTERM), t0);
        let acts = m.on(Input::Signal(libc::SIGTERM), secs(t0, 0.001));
        assert_eq!(acts[1], Action::KillTree { note_live: false });
        assert_eq!(m.deadline(), None, "no grace left to wait for");
        assert_eq!(m.exit_status(137), 143);
    }

    #[test]
    fn a_fatal_before_ready_gives_the_child_a_moment_then_kills() {
        let (mut m, t0) = machine(false, Node::default());
        assert!(m.on(Input::Fatal, t0).is_empty());
        assert_eq!(m.deadline(), Some(t0 + FATAL_SELF_EXIT));
        assert_eq!(
            m.tick(t0 + FATAL_SELF_EXIT),
            vec![Action::KillTree { note_live: true }]
        );
        assert_eq!(m.exit_status(2), 2, "it ended itself: its own status");
        m.note_killed_live(true);
        assert_eq!(m.exit_status(137), 1, "we killed a live server: 1");
    }

    #[test]
    fn a_fatal_after_ready_changes_nothing() {
        let (mut m, t0) = machine(true, Node::default());
        assert_eq!(m.tick(t0), vec![Action::Check(Evidence::None)]);
        m.on(Input::Checked(Ok("/health")), t0);
        assert!(m.on(Input::Fatal, t0).is_empty());
        assert!(m.is_ready());
        assert_eq!(m.exit_status(0), 0);
    }

    #[test]
    fn the_ready_timeout_stops_the_server_and_exits_124() {
        let (mut m, t0) = machine(false, Node::default());
        let acts = m.tick(secs(t0, 600.0));
        assert_eq!(acts[0], Action::ReadyTimedOut);
        assert_eq!(
            acts[1],
            Action::Send {
                dest: PID,
                sig: libc::SIGTERM
            }
        );
        assert_eq!(m.exit_status(137), 124);
        assert!(!m.requested());
    }
}
