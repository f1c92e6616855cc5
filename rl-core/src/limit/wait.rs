//! The waiting line of a concurrency limit (`rl_conn ... queue=`): requests
//! over the limit wait for a slot in the order they came, at most `q` of
//! them, each at most until its deadline; a waiter that leaves (its client
//! gone, its wait over) gives its place up at once.
//!
//! The state is caller-owned words after the line's own (the units in
//! flight, [`super::conn`]): `[head, tail, ring...]`. Tickets are issued in
//! order (`tail`), served in order (`head`); ticket `t` keeps its deadline
//! (whole seconds, rounded up, plus one: a wait that runs late by a timer's
//! tick still finds its place) in `ring[t % q]`, two to a word, 0 when
//! empty. A place whose deadline has passed is given up by whoever looks
//! next: a waiter whose worker died (`kill -9`) holds the line up to its
//! deadline, never longer.
//!
//! Strictly first come, first served, across every process that shares the
//! state: a waiter is admitted only at the head, and only once the units it
//! asks for are free; one that asks for more than is free holds those behind
//! it back (as a FIFO queue does), and an arrival never passes a live
//! waiter.

/// Words a waiting line of `q` places takes after the line's own.
pub const fn words(q: u64) -> usize {
    2 + q.div_ceil(2) as usize
}

/// What an arrival gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arrival {
    /// Units free and nobody waiting: admitted at once (the units are
    /// taken).
    Admitted,
    /// A place in the line, to [`Wait::poll`] with.
    Waiting { ticket: u64 },
    /// The line is full (or `cost` can never fit): refused at once.
    Refused,
}

/// What a waiter finds when it looks again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Turn {
    /// Its turn, and its units: admitted (the units are taken, the place
    /// given up).
    Admitted,
    /// Still waiting, with this many places before it.
    Waiting { ahead: u64 },
    /// Its place is gone (its deadline passed): refused.
    Gone,
}

/// A view of one key's state: the units in flight (`units`), the most
/// (`max`), and its waiting line of `q` places (`line`, [`words`] long).
pub struct Wait<'a> {
    pub units: &'a mut u64,
    pub max: u64,
    pub q: u64,
    pub line: &'a mut [u64],
}

impl Wait<'_> {
    fn head(&self) -> u64 {
        self.line.first().copied().unwrap_or(0)
    }

    fn tail(&self) -> u64 {
        self.line.get(1).copied().unwrap_or(0)
    }

    /// The deadline kept for ticket `t` (0: none).
    fn deadline(&self, t: u64) -> u32 {
        let i = (t % self.q.max(1)) as usize;
        let w = self.line.get(2 + i / 2).copied().unwrap_or(0);
        (w >> (32 * (i % 2))) as u32
    }

    fn set_deadline(&mut self, t: u64, d: u32) {
        let i = (t % self.q.max(1)) as usize;
        let shift = 32 * (i % 2);
        if let Some(w) = self.line.get_mut(2 + i / 2) {
            *w = (*w & !(0xffff_ffffu64 << shift)) | (u64::from(d) << shift);
        }
    }

    /// Gives up the places at the head that are empty or past their
    /// deadline at `now_s`.
    fn advance(&mut self, now_s: u32) {
        let (mut head, tail) = (self.head(), self.tail());
        while head < tail {
            let d = self.deadline(head);
            if d != 0 && d >= now_s {
                break;
            }
            self.set_deadline(head, 0);
            head += 1;
        }
        if let Some(h) = self.line.first_mut() {
            *h = head;
        }
    }

    fn fits(&self, cost: u64) -> bool {
        cost <= self.max.saturating_sub(*self.units)
    }

    /// A request of `cost` arrives at `now_s` (seconds), willing to wait
    /// until `deadline_s`.
    pub fn arrive(&mut self, now_s: u32, cost: u64, deadline_s: u32) -> Arrival {
        if self.line.len() < words(self.q) || cost > self.max {
            return Arrival::Refused;
        }
        self.advance(now_s);
        let (head, tail) = (self.head(), self.tail());
        if head == tail && self.fits(cost) {
            *self.units += cost;
            return Arrival::Admitted;
        }
        if tail - head >= self.q {
            return Arrival::Refused;
        }
        self.set_deadline(tail, deadline_s.max(now_s).max(1));
        if let Some(t) = self.line.get_mut(1) {
            *t = tail + 1;
        }
        Arrival::Waiting { ticket: tail }
    }

    /// The waiter of `ticket` looks again at `now_s`.
    pub fn poll(&mut self, now_s: u32, cost: u64, ticket: u64) -> Turn {
        if self.line.len() < words(self.q) {
            return Turn::Gone;
        }
        self.advance(now_s);
        let head = self.head();
        if ticket < head || ticket >= self.tail() {
            return Turn::Gone;
        }
        let d = self.deadline(ticket);
        if d == 0 || d < now_s {
            // (past its deadline behind a live waiter: given up now, not when the head comes)
            self.set_deadline(ticket, 0);
            return Turn::Gone;
        }
        if ticket > head || !self.fits(cost) {
            return Turn::Waiting { ahead: ticket - head };
        }
        *self.units += cost;
        self.set_deadline(ticket, 0);
        self.advance(now_s);
        Turn::Admitted
    }

    /// The waiter of `ticket` leaves the line (its client went away, or it
    /// stopped waiting).
    pub fn leave(&mut self, now_s: u32, ticket: u64) {
        if self.line.len() < words(self.q) || ticket < self.head() || ticket >= self.tail() {
            return;
        }
        self.set_deadline(ticket, 0);
        self.advance(now_s);
    }

    /// Units free now.
    pub fn free(&self) -> u64 {
        self.max.saturating_sub(*self.units)
    }

    /// Places taken in the line: those given up behind a live waiter count
    /// until the head passes them (an arrival may so be refused with fewer
    /// than `q` waiting, never let in with more).
    pub fn waiting(&self) -> u64 {
        self.tail() - self.head()
    }
}
