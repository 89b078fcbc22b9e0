package rdb

import (
	"context"
	"crypto/sha1"
	_ "embed"
	"encoding/hex"
	"fmt"

	"github.com/redis/go-redis/v9"
)

//go:embed lua/promote.lua
var promoteLua string

var promoteScript = redis.NewScript(promoteLua)

// PromoteArgs is one move of a waiting job to another tier's queue of its
// pool (lua/promote.lua).
type PromoteArgs struct {
	Pool, ID string
	// From is the queue the job is in, To the queue it moves to.
	From, To string
	// Msg is the job's task message as read (FindJob): the move happens
	// only if it is still the same. NewMsg is the message rewritten for To
	// (Retarget), and Lock the unique lock Retarget found in it, or nil.
	Msg, NewMsg string
	Lock        *UniqueLock
}

// PromoteOutcome says what a promote did.
type PromoteOutcome int

const (
	// Moved: the job moved, in its State (pending, scheduled or retry).
	Moved PromoteOutcome = iota + 1
	// NotWaiting: the job is not waiting (State says active, completed,
	// archived...): not moved.
	NotWaiting
	// Changed: the job's message is not the one read: read it again.
	Changed
	// Gone: no job in From any more: look again.
	Gone
	// Conflict: something is in the way (Why says what); nothing changed.
	Conflict
)

// PromoteReply is what a promote did.
type PromoteReply struct {
	Outcome PromoteOutcome
	// State is the job's state, with Moved and NotWaiting.
	State string
	// Why says what is in the way, with Conflict.
	Why string
}

// Promote moves a waiting job from its queue to another of its pool's, in
// one step, with what refers to it by queue: its failure count, the
// pool's breaker's memory of it, and asynq's unique lock when it holds
// one. Every key is the pool's; asynq's set of queue names is not written
// (PublishQueue the target first).
func (j *Jobs) Promote(ctx context.Context, a PromoteArgs) (PromoteReply, error) {
	_, _, suspects, _ := j.ks.BreakerKeys(a.Pool)
	keys := []string{
		TaskKey(a.From, a.ID), TaskKey(a.To, a.ID),
		PendingKey(a.From), scheduledKey(a.From), retryKey(a.From),
		PendingKey(a.To), scheduledKey(a.To), retryKey(a.To),
		j.ks.FailureCountKey(a.From, a.ID), j.ks.FailureCountKey(a.To, a.ID),
		suspects, j.ks.BreakerLateKey(a.Pool), j.ks.breakerCountedKey(a.Pool),
	}
	hasLock := "0"
	if a.Lock != nil {
		hasLock = "1"
		keys = append(keys, a.Lock.From, a.Lock.To)
	}
	sum := sha1.Sum([]byte(a.Msg))
	args := []any{a.ID, hex.EncodeToString(sum[:]), a.NewMsg,
		Member{ID: a.ID, Queue: a.From}.String(), Member{ID: a.ID, Queue: a.To}.String(), hasLock}
	reply, err := promoteScript.Run(ctx, j.rc, keys, args...).StringSlice()
	if err != nil {
		return PromoteReply{}, fmt.Errorf("promote job %q: %w", a.ID, err)
	}
	bad := func() (PromoteReply, error) {
		return PromoteReply{}, fmt.Errorf("promote job %q: the script replied %q", a.ID, reply)
	}
	if len(reply) == 0 {
		return bad()
	}
	switch reply[0] {
	case "moved", "state", "conflict":
		if len(reply) != 2 || reply[1] == "" {
			return bad()
		}
	case "changed", "gone":
		if len(reply) != 1 {
			return bad()
		}
	}
	switch reply[0] {
	case "moved":
		return PromoteReply{Outcome: Moved, State: reply[1]}, nil
	case "state":
		return PromoteReply{Outcome: NotWaiting, State: reply[1]}, nil
	case "changed":
		return PromoteReply{Outcome: Changed}, nil
	case "gone":
		return PromoteReply{Outcome: Gone}, nil
	case "conflict":
		return PromoteReply{Outcome: Conflict, Why: reply[1]}, nil
	}
	return bad()
}
