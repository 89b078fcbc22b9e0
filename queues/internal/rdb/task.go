package rdb

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
)

// ReadyAtHeader carries, in a job's asynq headers, when the job is ready to
// run (Unix nanoseconds): its enqueue time plus its delay.
const ReadyAtHeader = "compartment-ready-at"

// Task is what the engine puts in asynq's task message (its protobuf
// TaskMessage) for a job it writes itself: the fields asynq's client sets
// for a job enqueued with the options the engine uses.
type Task struct {
	Type    string
	Payload []byte
	ID      string
	Queue   string
	// Retry is asynq's retry budget (0: none).
	Retry int
	// Timeout is the job's deadline, in whole seconds.
	Timeout time.Duration
	// Retention keeps the finished job this long (0: not at all).
	Retention time.Duration
	// ReadyAt is when the job is ready to run, Unix nanoseconds: it goes in
	// the ReadyAtHeader header.
	ReadyAt int64
	// Headers are more headers, as key, value pairs (a trace's context).
	Headers []string
}

// AppendTask appends t's encoding as asynq's task message to b.
// TestDoorWritesAsynqJobs pins it against what asynq itself reads back.
func AppendTask(b []byte, t Task) []byte {
	if b == nil {
		b = make([]byte, 0, 96+len(t.Type)+len(t.Payload)+len(t.ID)+len(t.Queue))
	}
	b = protowire.AppendTag(b, 1, protowire.BytesType)
	b = protowire.AppendString(b, t.Type)
	if len(t.Payload) > 0 {
		b = protowire.AppendTag(b, 2, protowire.BytesType)
		b = protowire.AppendBytes(b, t.Payload)
	}
	b = protowire.AppendTag(b, 3, protowire.BytesType)
	b = protowire.AppendString(b, t.ID)
	// headers (15): the ready-at time, then any others.
	var digits [20]byte
	b = appendHeader(b, ReadyAtHeader, strconv.AppendInt(digits[:0], t.ReadyAt, 10))
	for i := 0; i+1 < len(t.Headers); i += 2 {
		b = appendHeader(b, t.Headers[i], t.Headers[i+1])
	}
	b = protowire.AppendTag(b, 4, protowire.BytesType)
	b = protowire.AppendString(b, t.Queue)
	if t.Retry != 0 {
		b = protowire.AppendTag(b, 5, protowire.VarintType)
		b = protowire.AppendVarint(b, uint64(t.Retry))
	}
	b = protowire.AppendTag(b, 8, protowire.VarintType)
	b = protowire.AppendVarint(b, uint64(t.Timeout/time.Second))
	if s := int64(t.Retention / time.Second); s > 0 {
		b = protowire.AppendTag(b, 12, protowire.VarintType)
		b = protowire.AppendVarint(b, uint64(s))
	}
	return b
}

// UniqueLock is the key of asynq's unique lock a job's message names
// (From), and that key in the queue the job moves to (To).
type UniqueLock struct{ From, To string }

// Retarget rewrites asynq's task message of a job in queue from for queue
// to: its queue field (4) and, for a job enqueued with asynq's Unique
// option, its unique lock's key (10), which names the queue. With a
// non-zero readyAt (a pending job, whose wait restarts at the promotion)
// the job's ready-at header (in headers, 15) says readyAt, so that the
// starvation guard counts its wait in the new tier from then, as asynq's
// pending_since does. Every other field is copied byte for byte, in its
// place.
func Retarget(msg, from, to string, readyAt time.Time) (string, *UniqueLock, error) {
	b := []byte(msg)
	out := make([]byte, 0, len(b)+len(to)-len(from))
	var lock *UniqueLock
	sawQueue := false
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return "", nil, fmt.Errorf("asynq task message: %w", protowire.ParseError(n))
		}
		m := protowire.ConsumeFieldValue(num, typ, b[n:])
		if m < 0 {
			return "", nil, fmt.Errorf("asynq task message: field %d: %w", num, protowire.ParseError(m))
		}
		field := b[:n+m]
		b = b[n+m:]
		if typ != protowire.BytesType || (num != 4 && num != 10 && num != 15) {
			out = append(out, field...)
			continue
		}
		v, _ := protowire.ConsumeBytes(field[n:])
		switch num {
		case 15:
			if readyAt.IsZero() || headerKey(v) != ReadyAtHeader {
				out = append(out, field...)
				continue
			}
			out = appendHeader(out, ReadyAtHeader, strconv.AppendInt(nil, readyAt.UnixNano(), 10))
			continue
		case 4:
			if string(v) != from {
				return "", nil, fmt.Errorf("asynq task message names queue %q, but the job is in %q", v, from)
			}
			sawQueue = true
			v = []byte(to)
		case 10:
			prefix := QueueKey(from, "")
			if len(v) == 0 || !strings.HasPrefix(string(v), prefix) {
				out = append(out, field...)
				continue
			}
			lock = &UniqueLock{From: string(v), To: QueueKey(to, "") + string(v[len(prefix):])}
			v = []byte(lock.To)
		}
		out = protowire.AppendTag(out, num, protowire.BytesType)
		out = protowire.AppendBytes(out, v)
	}
	if !sawQueue {
		return "", nil, fmt.Errorf("asynq task message names no queue")
	}
	return string(out), lock, nil
}

// appendHeader appends one entry of a TaskMessage's headers map (15): a
// message of key (1) and value (2).
func appendHeader[V ~string | ~[]byte](b []byte, key string, value V) []byte {
	entry := protowire.SizeTag(1) + protowire.SizeBytes(len(key)) + protowire.SizeTag(2) + protowire.SizeBytes(len(value))
	b = protowire.AppendTag(b, 15, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(entry))
	b = protowire.AppendTag(b, 1, protowire.BytesType)
	b = protowire.AppendString(b, key)
	b = protowire.AppendTag(b, 2, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(len(value)))
	return append(b, value...)
}

// headerKey returns the key of one entry of a TaskMessage's headers map (a
// message of key (1) and value (2)), or "".
func headerKey(entry []byte) string { return string(bytesField(entry, 1)) }

// bytesField returns the first field num of wire type bytes in the
// protobuf message b, nil for none (or a message that does not parse).
func bytesField(b []byte, num protowire.Number) []byte {
	for len(b) > 0 {
		n2, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil
		}
		m := protowire.ConsumeFieldValue(n2, typ, b[n:])
		if m < 0 {
			return nil
		}
		if n2 == num && typ == protowire.BytesType {
			v, _ := protowire.ConsumeBytes(b[n:])
			return v
		}
		b = b[n+m:]
	}
	return nil
}

// TaskHeader returns the value of header key in an asynq task message, or
// "" (none, or a message that does not parse).
func TaskHeader(msg, key string) string {
	b := []byte(msg)
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return ""
		}
		m := protowire.ConsumeFieldValue(num, typ, b[n:])
		if m < 0 {
			return ""
		}
		if num == 15 && typ == protowire.BytesType {
			entry, _ := protowire.ConsumeBytes(b[n:])
			if headerKey(entry) == key {
				return headerValue(entry)
			}
		}
		b = b[n+m:]
	}
	return ""
}

// headerValue returns the value (2) of one entry of a TaskMessage's
// headers map, or "".
func headerValue(entry []byte) string { return string(bytesField(entry, 2)) }

// TaskError returns the error message asynq stored in a task message
// (field 7, error_msg): why it last failed; "" for none.
func TaskError(msg string) string { return string(bytesField([]byte(msg), 7)) }
