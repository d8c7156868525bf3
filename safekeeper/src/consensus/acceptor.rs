//! The acceptor (safekeeper) state machine.

use super::{Record, Term, TermHistory, ToAcceptor, ToProposer};
use proto::Lsn;

/// Everything an acceptor keeps durably: the control file (term, history, commit LSN) and
/// the WAL. The in-memory state is the same structure; a restart rebuilds it from disk.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AcceptorState {
    /// The highest term seen (and voted for, if a vote was asked).
    pub term: Term,
    /// The history of the last elected proposer whose WAL this acceptor took.
    pub history: TermHistory,
    pub commit_lsn: Lsn,
    pub wal: Vec<Record>,
}

impl AcceptorState {
    pub fn flush_lsn(&self) -> Lsn {
        self.wal.last().map_or(Lsn(0), |r| r.end)
    }

    /// The term of the last history entry that covers the flushed WAL.
    pub fn last_log_term(&self) -> Term {
        self.history.up_to(self.flush_lsn()).last_term()
    }

    /// Applies one durable change. The acceptor applies it to its memory; the I/O shell
    /// applies it to disk.
    pub fn apply(&mut self, p: &Persist) {
        match p {
            Persist::Control { term, history, commit_lsn } => {
                self.term = *term;
                self.history = history.clone();
                self.commit_lsn = *commit_lsn;
            }
            Persist::Truncate { at } => self.wal.retain(|r| r.end <= *at),
            Persist::Append { records } => self.wal.extend(records.iter().cloned()),
        }
    }
}

/// A durable change, to be made durable before the actions that follow it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Persist {
    /// Replace the control file.
    Control { term: Term, history: TermHistory, commit_lsn: Lsn },
    /// Remove WAL after `at` (a record boundary).
    Truncate { at: Lsn },
    /// Append records right after the flush LSN.
    Append { records: Vec<Record> },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AcceptorAction {
    Persist(Persist),
    Reply(ToProposer),
}

/// A safekeeper's side of the protocol.
#[derive(Clone, Debug)]
pub struct Acceptor {
    state: AcceptorState,
}

impl Acceptor {
    /// An acceptor with the given durable state (empty for a new one, from disk on restart).
    pub fn new(state: AcceptorState) -> Acceptor {
        Acceptor { state }
    }

    pub fn state(&self) -> &AcceptorState {
        &self.state
    }

    fn persist(&mut self, out: &mut Vec<AcceptorAction>, p: Persist) {
        self.state.apply(&p);
        out.push(AcceptorAction::Persist(p));
    }

    fn persist_control(&mut self, out: &mut Vec<AcceptorAction>) {
        let p = Persist::Control {
            term: self.state.term,
            history: self.state.history.clone(),
            commit_lsn: self.state.commit_lsn,
        };
        out.push(AcceptorAction::Persist(p));
    }

    fn rejected(&self, term: Term) -> AcceptorAction {
        AcceptorAction::Reply(ToProposer::Rejected { term, acceptor_term: self.state.term })
    }

    /// Handles one message. `Persist` actions come before the reply that depends on them.
    pub fn handle(&mut self, msg: ToAcceptor) -> Vec<AcceptorAction> {
        let mut out = Vec::new();
        match msg {
            ToAcceptor::Greeting => {
                out.push(AcceptorAction::Reply(ToProposer::GreetingReply { term: self.state.term }));
            }
            ToAcceptor::VoteRequest { term } => {
                let granted = term > self.state.term;
                if granted {
                    self.state.term = term;
                    self.persist_control(&mut out);
                }
                out.push(AcceptorAction::Reply(ToProposer::Vote {
                    term,
                    granted,
                    acceptor_term: self.state.term,
                    history: self.state.history.clone(),
                    flush_lsn: self.state.flush_lsn(),
                    commit_lsn: self.state.commit_lsn,
                }));
            }
            ToAcceptor::Elected { term, history, start_lsn } => {
                if term < self.state.term {
                    out.push(self.rejected(term));
                    return out;
                }
                if self.state.history.last_term() != term {
                    // First time we hear of this election: cut our WAL back to what we share
                    // with the elected history, never below what we know is committed.
                    let flush = self.state.flush_lsn();
                    let ours = self.state.history.up_to(flush);
                    let at = ours.common_point(flush, &history.up_to(start_lsn), start_lsn);
                    if at < self.state.commit_lsn {
                        // Cannot happen with a correct proposer; refuse rather than lose
                        // committed WAL.
                        return out;
                    }
                    if at < flush {
                        self.persist(&mut out, Persist::Truncate { at });
                    }
                    self.state.term = term;
                    self.state.history = history;
                    self.persist_control(&mut out);
                }
                // A duplicate of an election we already took changes nothing.
                out.push(AcceptorAction::Reply(ToProposer::ElectedAck {
                    term,
                    flush_lsn: self.state.flush_lsn(),
                }));
            }
            ToAcceptor::FetchWal { term, from } => {
                if term != self.state.term {
                    out.push(self.rejected(term));
                    return out;
                }
                let records = self.state.wal.iter().filter(|r| r.start >= from).cloned().collect();
                out.push(AcceptorAction::Reply(ToProposer::Wal { term, from, records }));
            }
            ToAcceptor::Append { term, begin_lsn, records, commit_lsn } => {
                if term < self.state.term {
                    out.push(self.rejected(term));
                    return out;
                }
                if term != self.state.term || self.state.history.last_term() != term {
                    // Not yet joined to this term's election; the proposer resends Elected.
                    return out;
                }
                let flush = self.state.flush_lsn();
                if begin_lsn > flush {
                    // A gap: tell the proposer where we are.
                    out.push(AcceptorAction::Reply(ToProposer::AppendAck {
                        term,
                        flush_lsn: flush,
                        commit_lsn: self.state.commit_lsn,
                    }));
                    return out;
                }
                // Records below our flush LSN are the same ones (our WAL is a prefix of this
                // term's history); take only what is new.
                let new: Vec<Record> = records.into_iter().filter(|r| r.start >= flush).collect();
                let contiguous = new.first().is_none_or(|r| r.start == flush)
                    && new.windows(2).all(|w| w[0].end == w[1].start);
                if !new.is_empty() && contiguous {
                    self.persist(&mut out, Persist::Append { records: new });
                }
                let commit = commit_lsn.min(self.state.flush_lsn());
                if commit > self.state.commit_lsn {
                    self.state.commit_lsn = commit;
                    self.persist_control(&mut out);
                }
                out.push(AcceptorAction::Reply(ToProposer::AppendAck {
                    term,
                    flush_lsn: self.state.flush_lsn(),
                    commit_lsn: self.state.commit_lsn,
                }));
            }
        }
        out
    }
}
