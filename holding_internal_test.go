package ferry

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestTransitionTable covers every (phase, event) pair of the holding's
// state machine: the pairs listed move as listed; every other pair cannot
// happen and leaves the phase as it is.
func TestTransitionTable(t *testing.T) {
	type to struct {
		next phase
		do   action
	}
	const (
		stop    = doStopIntake | doDrain
		lose    = doStopIntake | doCancelHandlers
		giveUp  = doCancelHandlers | doCommit
		nothing = action(0)
	)
	want := map[phase]map[event]to{
		acquiring: {
			evGranted: {loading, nothing},
			evFailed:  {released, nothing},
			evRevoke:  {released, nothing},
			evClosing: {released, nothing},
		},
		loading: {
			evLoaded:  {fetching, doAnnounce},
			evFailed:  {released, nothing},
			evRevoke:  {releasing, stop},
			evClosing: {releasing, stop},
			evLost:    {lost, lose},
		},
		fetching: {
			evRevoke:  {releasing, stop},
			evClosing: {releasing, stop},
			evLost:    {lost, lose},
		},
		releasing: {
			evDrained:      {released, doCommit},
			evDrainTimeout: {released, giveUp},
			evLost:         {lost, doCancelHandlers},
			evRevoke:       {releasing, nothing},
			evClosing:      {releasing, nothing},
		},
		released: {
			evRevoke:  {released, nothing},
			evClosing: {released, nothing},
			evLost:    {released, nothing},
		},
		lost: {
			evRevoke:       {lost, nothing},
			evClosing:      {lost, nothing},
			evLost:         {lost, nothing},
			evDrained:      {lost, nothing},
			evDrainTimeout: {lost, nothing},
		},
	}
	require.Len(t, want, int(numPhases), "every phase is in the table")
	for p := range numPhases {
		for e := range numEvents {
			next, do, ok := transition(p, e)
			w, listed := want[p][e]
			if !listed {
				assert.False(t, ok, "%s + %s cannot happen", p, e)
				assert.Equal(t, p, next, "%s + %s leaves the phase", p, e)
				assert.Zero(t, do, "%s + %s does nothing", p, e)
				continue
			}
			assert.True(t, ok, "%s + %s", p, e)
			assert.Equal(t, w.next, next, "%s + %s: next phase", p, e)
			assert.Equal(t, w.do, do, "%s + %s: actions", p, e)
		}
	}
}

// TestTransitionInvariants checks what the gates rely on, over every
// path: nothing leaves released or lost but to itself; lost never
// commits; only loading+loaded announces; work is only admitted in
// fetching.
func TestTransitionInvariants(t *testing.T) {
	for p := range numPhases {
		for e := range numEvents {
			next, do, ok := transition(p, e)
			if !ok {
				continue
			}
			if p == released || p == lost {
				assert.Equal(t, p, next, "%s is final (%s)", p, e)
			}
			if next == lost {
				assert.Zero(t, do&(doCommit|doDrain), "%s + %s: a lost holding neither drains nor commits", p, e)
			}
			if do&doAnnounce != 0 {
				assert.Equal(t, [2]any{loading, evLoaded}, [2]any{p, e})
			}
		}
	}
	var h holding
	for p := range numPhases {
		h.setPhase(p)
		assert.Equal(t, p == fetching, h.serving(), "%s serving", p)
		assert.Equal(t, p == fetching, h.takes(), "%s takes", p)
		assert.Equal(t, p == fetching || p == releasing, h.lands(), "%s lands", p)
	}
	h.setPhase(fetching)
	require.True(t, h.hold(holdPause, true))
	assert.False(t, h.takes(), "paused: no take")
	assert.True(t, h.serving(), "paused: what is in flight goes on")
	require.True(t, h.hold(holdPause, false))
	assert.False(t, h.hold(holdPause, false), "cleared twice")
	require.True(t, h.post(evRevoke))
	assert.False(t, h.post(evRevoke), "posted once")
	assert.False(t, h.serving(), "revoked: no start at once, before the phase is stepped")
	assert.True(t, h.lands(), "revoked: what finishes still lands")
	require.True(t, h.post(evLost))
	assert.False(t, h.lands(), "lost: nothing lands at once")
	assert.Equal(t, fetching, h.phase(), "a post leaves the phase to the holding's goroutine")
}
