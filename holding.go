package ferry

import (
	"fmt"
	"sync/atomic"
)

// The hold on a queue. A member's hold on one queue (a queueRun) goes
// through phases, stepped by a pure transition function:
//
//	acquiring --granted--> loading --loaded--> fetching
//	fetching --revoke/closing--> releasing --drained/drainTimeout--> released
//	any hold of the lease --lost--> lost
//	acquiring, loading --failed--> released
//
// One goroutine at a time writes the phase: the holding's own (the one
// taking the queue, then the fetch loop's turns, which its kick counter
// serializes). Everyone else posts events: a rebalance posts revoke, a
// closing member closing, the lease's loss, an expired local deadline or
// a fenced commit lost. A posted event takes effect on the gates at once
// (see admit), and the holding's goroutine steps it, running what the
// transition says (stopping intake, draining, cancelling handlers, the
// last commit). No consumer code runs in a coordinator's lock: a post
// sets a bit, cancels the fetch context and wakes the loop.
//
// Every unit of work on the queue's messages carries its holding (the
// *queueRun: a batch, a retry item, a polled message's queue) and passes
// admit before it starts and finishes before its effect lands. Pause and
// seek are holds: they stop takes, not what is in flight.

// phase is where a member's hold on a queue stands.
type phase uint8

const (
	acquiring phase = iota // waiting for the queue's lock
	loading                // the lock is held; the cursor is being loaded
	fetching               // owned: messages are fetched and handled
	releasing              // revoked or closing: no work starts; what is in flight drains
	released               // drained (or given up) and committed for the last time: nothing lands
	lost                   // the lease is gone (lost, expired, fenced): nothing lands, nothing is committed
	numPhases
)

var phaseNames = [numPhases]string{"acquiring", "loading", "fetching", "releasing", "released", "lost"}

func (p phase) String() string {
	if p < numPhases {
		return phaseNames[p]
	}
	return fmt.Sprintf("phase(%d)", uint8(p))
}

// event is what happens to a holding.
type event uint8

const (
	evGranted      event = iota // the queue's lock was taken
	evLoaded                    // the cursor was loaded
	evFailed                    // taking the lock or loading the cursor failed
	evRevoke                    // a rebalance gave the queue to another member
	evClosing                   // the member closes
	evLost                      // the lease was lost, may have expired by the local clock, or a commit was fenced
	evDrained                   // everything in flight finished
	evDrainTimeout              // the drain timeout gave up on what was in flight
	numEvents
)

var eventNames = [numEvents]string{"granted", "loaded", "failed", "revoke", "closing", "lost", "drained", "drainTimeout"}

func (e event) String() string {
	if e < numEvents {
		return eventNames[e]
	}
	return fmt.Sprintf("event(%d)", uint8(e))
}

// action is what a transition has the holding's goroutine do, after the
// new phase is published.
type action uint8

const (
	doAnnounce       action = 1 << iota // the assigned callbacks; Start stops waiting for the queue
	doStopIntake                        // close the buffer and stop fetching: nothing is taken any more
	doDrain                             // wait for what is in flight, up to the drain timeout
	doCancelHandlers                    // cancel the handlers' context
	doCommit                            // commit the cursor for the last time
)

// transition is the holding's state machine: the phase after e in p and
// what the holding's goroutine does for it. ok is false for an event that
// cannot happen in p; the holding ignores it. It is pure: the table test
// covers every pair.
func transition(p phase, e event) (next phase, do action, ok bool) {
	switch p {
	case acquiring:
		switch e {
		case evGranted:
			return loading, 0, true
		case evFailed, evRevoke, evClosing:
			return released, 0, true // nothing was held
		}
	case loading:
		switch e {
		case evLoaded:
			return fetching, doAnnounce, true
		case evFailed:
			return released, 0, true // nothing was fetched; the lock is given back
		case evRevoke, evClosing:
			return releasing, doStopIntake | doDrain, true
		case evLost:
			return lost, doStopIntake | doCancelHandlers, true
		}
	case fetching:
		switch e {
		case evRevoke, evClosing:
			return releasing, doStopIntake | doDrain, true
		case evLost:
			return lost, doStopIntake | doCancelHandlers, true
		}
	case releasing:
		switch e {
		case evDrained:
			return released, doCommit, true
		case evDrainTimeout:
			return released, doCancelHandlers | doCommit, true
		case evLost:
			return lost, doCancelHandlers, true // the token is stale: no drain, no commit
		case evRevoke, evClosing:
			return releasing, 0, true
		}
	case released:
		switch e {
		case evRevoke, evClosing, evLost:
			return released, 0, true // late: nothing is held any more
		}
	case lost:
		switch e {
		case evRevoke, evClosing, evLost, evDrained, evDrainTimeout:
			return lost, 0, true
		}
	}
	return p, 0, false
}

// The holding's state word: the phase in its low byte, the events posted
// (sticky: a holding is revoked once), and the holds on takes.
const (
	phaseMask    = 0xff
	postedRevoke = 1 << (8 + iota)
	postedClosing
	postedLost
	holdPause // Pause: no take
	holdSeek  // a seek waits for what is in flight: no take

	postedStop = postedRevoke | postedClosing | postedLost
	holds      = holdPause | holdSeek
)

// postedBit returns the state bit of a posted event, 0 for an event the
// holding's goroutine steps itself.
func postedBit(e event) uint32 {
	switch e {
	case evRevoke:
		return postedRevoke
	case evClosing:
		return postedClosing
	case evLost:
		return postedLost
	}
	return 0
}

// holding is the state of a hold on a queue (see the top of this file).
type holding struct {
	st atomic.Uint32
	// stepped: the posted events the holding's goroutine has stepped.
	// Its own.
	stepped uint32
}

func (h *holding) phase() phase { return phase(h.st.Load() & phaseMask) }

// setPhase publishes p. The holding's goroutine only.
func (h *holding) setPhase(p phase) {
	for {
		s := h.st.Load()
		if h.st.CompareAndSwap(s, s&^phaseMask|uint32(p)) {
			return
		}
	}
}

// post records e (revoke, closing or lost) and reports whether it is new.
func (h *holding) post(e event) bool {
	bit := postedBit(e)
	return h.st.Or(bit)&bit == 0
}

// hold sets or clears a hold (holdPause, holdSeek); it reports whether it
// changed.
func (h *holding) hold(bit uint32, on bool) bool {
	if on {
		return h.st.Or(bit)&bit == 0
	}
	return h.st.And(^bit)&bit != 0
}

// held reports whether the hold bit is set.
func (h *holding) held(bit uint32) bool { return h.st.Load()&bit != 0 }

// posted reports whether e was posted.
func (h *holding) posted(e event) bool { return h.st.Load()&postedBit(e) != 0 }

// serving reports whether work on the queue's messages may start: the
// queue is fetched and neither revoked, closing nor lost. Holds stop
// takes only (see takes).
func (h *holding) serving() bool {
	s := h.st.Load()
	return phase(s&phaseMask) == fetching && s&postedStop == 0
}

// takes reports whether messages may be taken from the buffer: serving,
// and neither paused nor seeking.
func (h *holding) takes() bool {
	s := h.st.Load()
	return phase(s&phaseMask) == fetching && s&(postedStop|holds) == 0
}

// lands reports whether the effect of finished work may land (a Done, a
// commit, a retry or dead-letter write): until the holding is released,
// never once its lease is lost.
func (h *holding) lands() bool {
	s := h.st.Load()
	p := phase(s & phaseMask)
	return (p == fetching || p == releasing) && s&postedLost == 0
}

// owned reports whether the lock is held and the cursor loaded, until the
// release ends.
func (h *holding) owned() bool {
	p := h.phase()
	return p == fetching || p == releasing
}
