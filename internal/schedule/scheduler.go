package schedule

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Clock tells the time and waits. Tests drive a fake one instead of
// waiting for real minutes.
type Clock interface {
	Now() time.Time
	// After sends the time on the returned channel once d has passed.
	After(d time.Duration) <-chan time.Time
}

// SystemClock is the real clock.
func SystemClock() Clock { return OffsetClock(0) }

// OffsetClock is the real clock moved by d: it runs at the real pace but
// reads d later. The process-level tests use it (through the worker's
// test-only COMPARTMENT_TEST_CLOCK_OFFSET) to bring a fire time close.
func OffsetClock(d time.Duration) Clock { return offsetClock(d) }

type offsetClock time.Duration

func (c offsetClock) Now() time.Time                         { return time.Now().Add(time.Duration(c)) }
func (c offsetClock) After(d time.Duration) <-chan time.Time { return time.After(d) }

// RunFunc does a run: it enqueues schedule s's plan for period and says
// what that did. An error fails the run (another attempt may follow); the
// counts it returns with an error are kept in the record.
type RunFunc func(ctx context.Context, s *Schedule, period string) (Counts, error)

// Defaults of Options.
const (
	DefaultRecheck = time.Minute
	DefaultLate    = time.Minute
)

// Options tune a Scheduler. Zero fields take their defaults.
type Options struct {
	// Clock defaults to SystemClock().
	Clock Clock
	// Logger receives the runs' logs. Defaults to slog.Default().
	Logger *slog.Logger
	// ID names this process in claims and records. Defaults to
	// host:pid:random.
	ID string
	// Recheck is how often the loop looks again between fire times: for
	// runs another process holds (it may vanish), failed runs and Redis
	// errors. Defaults to DefaultRecheck.
	Recheck time.Duration
	// Late is how long after its fire time a run counts as a catch-up.
	// Defaults to DefaultLate.
	Late time.Duration
	// RunTimeout bounds one run's enqueue; it must end well inside the
	// store's lease so that no other process takes the run over while it
	// still enqueues. Defaults to the lease less a fifth.
	RunTimeout time.Duration
}

// Scheduler fires schedules. Every worker process runs one; a run happens
// once whichever of them are up (see Store). It also runs a schedule by
// hand (RunNow).
type Scheduler struct {
	schedules []*Schedule
	store     *Store
	run       RunFunc
	o         Options

	mu      sync.Mutex
	handled map[string]time.Time // per schedule: latest fire time known done
	// startedAt is when Start ran (unix ns by the clock; 0 before): a fire
	// time before it passed while this process was not looking.
	startedAt atomic.Int64

	life     sync.Mutex
	cancel   context.CancelFunc
	stopped  chan struct{}
	finished bool
}

// ErrUnknown is matched by RunNow's error for a name no schedule has.
var ErrUnknown = errors.New("unknown schedule")

// NewScheduler returns a scheduler of schedules whose runs store keeps
// and run does. Nothing runs until Start (or Tick, or RunNow).
func NewScheduler(schedules []*Schedule, store *Store, run RunFunc, o Options) *Scheduler {
	if o.Clock == nil {
		o.Clock = SystemClock()
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.ID == "" {
		o.ID = ProcessID()
	}
	if o.Recheck <= 0 {
		o.Recheck = DefaultRecheck
	}
	if o.Late <= 0 {
		o.Late = DefaultLate
	}
	if o.RunTimeout <= 0 {
		o.RunTimeout = store.Lease - store.Lease/5
	}
	return &Scheduler{schedules: schedules, store: store, run: run, o: o, handled: map[string]time.Time{}}
}

// ProcessID returns host:pid:random, unique to this process.
func ProcessID() string {
	host, _ := os.Hostname()
	return fmt.Sprintf("%s:%d:%s", host, os.Getpid(), randomHex(4))
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// ID is the name this scheduler writes in claims and records.
func (s *Scheduler) ID() string { return s.o.ID }

// Schedules returns the schedules, enabled or not, in config order.
func (s *Scheduler) Schedules() []*Schedule { return append([]*Schedule(nil), s.schedules...) }

// Get returns the schedule called name, or nil.
func (s *Scheduler) Get(name string) *Schedule {
	for _, sch := range s.schedules {
		if sch.Name == name {
			return sch
		}
	}
	return nil
}

// Tick does what is due at now: for each enabled schedule, the latest fire
// time within its catch-up window, unless that run is known done. Of
// several processes ticking at once, one claims each run and does it; the
// others find it busy or done. Tick returns the records of the runs this
// call did. A Redis error is logged and the run is tried again at the next
// tick.
func (s *Scheduler) Tick(ctx context.Context, now time.Time) []Record {
	var out []Record
	for _, sch := range s.schedules {
		if ctx.Err() != nil {
			break // stopping: the next process (or start) looks again
		}
		if sch.Disabled {
			continue
		}
		fire, ok := sch.Latest(now.Add(-sch.CatchUp), now)
		if !ok {
			continue
		}
		s.mu.Lock()
		seen := !fire.After(s.handled[sch.Name])
		s.mu.Unlock()
		if seen {
			continue
		}
		if rec, ran := s.fire(ctx, sch, fire, now); ran {
			out = append(out, rec)
		}
	}
	return out
}

// fire claims the run of sch at fire and does it if the claim is ours.
func (s *Scheduler) fire(ctx context.Context, sch *Schedule, fire, now time.Time) (Record, bool) {
	log := s.o.Logger.With("schedule", sch.Name, "scheduled_for", fire.In(sch.Location).Format(time.RFC3339))
	// A catch-up: the fire time passed before this process started
	// looking, or it is found more than Late after it.
	trigger := TriggerSchedule
	if started := s.startedAt.Load(); now.Sub(fire) > s.o.Late || (started != 0 && fire.UnixNano() < started) {
		trigger = TriggerCatchUp
	}
	rec := &Record{
		Schedule: sch.Name, ID: fire.UTC().Format(time.RFC3339), Trigger: trigger, Period: sch.PeriodFor(fire),
		ScheduledFor: fire, StartedAt: now, ClaimedBy: s.o.ID,
	}
	cr, err := s.store.Claim(ctx, rec, s.o.ID, fire)
	if err != nil {
		log.Warn("schedule: could not claim a run; trying again at the next check", "error", err, "next_check", s.o.Recheck.String())
		return Record{}, false
	}
	switch cr.Result {
	case Done:
		s.markHandled(sch.Name, fire)
		log.Debug("schedule: run already done by another process")
		return Record{}, false
	case Busy:
		log.Debug("schedule: another process holds this run", "holder", cr.Holder)
		return Record{}, false
	case Retry:
		log.Warn("schedule: taking up a run whose previous attempt failed or whose claimant vanished",
			"previous_state", cr.Previous, "attempt", cr.Attempt, "period", rec.Period)
	default:
		if trigger == TriggerCatchUp {
			log.Info("schedule: catching up a run missed while no worker ran it", "period", rec.Period,
				"late_by", now.Sub(fire).Round(time.Second).String(), "catch_up", sch.CatchUp.String())
		} else {
			log.Info("schedule: run starting", "period", rec.Period)
		}
	}
	s.execute(ctx, sch, rec, now)
	if rec.State == StateDone {
		s.markHandled(sch.Name, fire)
	}
	return *rec, true
}

func (s *Scheduler) markHandled(name string, fire time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if fire.After(s.handled[name]) {
		s.handled[name] = fire
	}
}

// execute runs a claimed run and writes its final record. The run is not
// cut short by ctx (a stopping worker lets an enqueue under way finish);
// RunTimeout bounds it. It returns the run's error, so that a caller can
// tell what kind it was (a refusal at the door, say).
func (s *Scheduler) execute(ctx context.Context, sch *Schedule, rec *Record, now time.Time) error {
	log := s.o.Logger.With("schedule", sch.Name, "run", rec.ID, "period", rec.Period, "trigger", rec.Trigger)
	began := time.Now()
	runCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.o.RunTimeout)
	counts, err := s.run(runCtx, sch, rec.Period)
	cancel()
	rec.Counts = counts
	rec.FinishedAt = now.Add(time.Since(began))
	rec.State = StateDone
	if err != nil {
		rec.State, rec.Error = StateFailed, err.Error()
	}
	fctx, fcancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	ferr := s.store.Finish(fctx, *rec, s.o.ID)
	fcancel()
	attrs := []any{"enqueued", counts.Enqueued, "already_present", counts.AlreadyPresent, "refused", counts.Refused,
		"took", time.Since(began).Round(time.Millisecond).String()}
	switch {
	case err != nil && rec.Trigger == TriggerManual:
		log.Error("schedule: manual run failed", append(attrs, "error", err)...)
	case err != nil:
		log.Error("schedule: run failed; another attempt follows while its fire time is inside the catch-up window", append(attrs, "error", err)...)
	case counts.Refused > 0:
		log.Warn("schedule: run done, some reports refused", attrs...)
	default:
		log.Info("schedule: run done", attrs...)
	}
	if ferr != nil {
		rec.State, rec.Error = StateFailed, strings.TrimSpace(rec.Error+"; "+ferr.Error())
		log.Error("schedule: could not write the run's record", "error", ferr)
	}
	return errors.Join(err, ferr)
}

// RunNow runs schedule name for period now, by hand: enabled or not, and
// whatever runs it had. period "" means the period a run firing now would
// cover. It returns the run's record; err is the run's error, or
// ErrUnknown (wrapped, listing the names) for an unknown name.
func (s *Scheduler) RunNow(ctx context.Context, name, period string) (Record, error) {
	sch := s.Get(name)
	if sch == nil {
		names := make([]string, len(s.schedules))
		for i, x := range s.schedules {
			names[i] = x.Name
		}
		return Record{}, fmt.Errorf("%w %q (schedules: %s)", ErrUnknown, name, strings.Join(names, ", "))
	}
	now := s.o.Clock.Now()
	if period == "" {
		period = sch.PeriodFor(now)
	}
	rec := &Record{
		Schedule: name, ID: "manual-" + now.UTC().Format("20060102T150405.000Z") + "-" + randomHex(3),
		Trigger: TriggerManual, Period: period, StartedAt: now, ClaimedBy: s.o.ID,
	}
	cr, err := s.store.Claim(ctx, rec, s.o.ID, now)
	if err != nil {
		return Record{}, err
	}
	if cr.Result != Claimed {
		return Record{}, fmt.Errorf("schedule %q: manual run %s could not be claimed (%s)", name, rec.ID, cr.Result)
	}
	s.o.Logger.Info("schedule: manual run starting", "schedule", name, "period", period)
	if err := s.execute(ctx, sch, rec, now); err != nil {
		return *rec, err
	}
	return *rec, nil
}

// Start starts the loop that fires the enabled schedules: at once (to
// catch up what was missed), at every fire time, and every Recheck. ctx
// bounds the start only. Starting twice, or after Stop, does nothing.
func (s *Scheduler) Start(ctx context.Context) error {
	s.life.Lock()
	defer s.life.Unlock()
	if s.cancel != nil || s.finished {
		return nil
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	s.startedAt.Store(s.o.Clock.Now().UnixNano())
	loopCtx, cancel := context.WithCancel(context.Background())
	s.cancel, s.stopped = cancel, make(chan struct{})
	go s.loop(loopCtx)
	return nil
}

// Stop stops the loop and waits for it, bounded by ctx; a run under way
// finishes first (within RunTimeout). Stopping twice, or before Start, is
// safe.
func (s *Scheduler) Stop(ctx context.Context) error {
	s.life.Lock()
	cancel, stopped := s.cancel, s.stopped
	s.finished = true
	s.life.Unlock()
	if cancel == nil {
		return nil
	}
	cancel()
	select {
	case <-stopped:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("schedule: a run was still under way: %w", ctx.Err())
	}
}

func (s *Scheduler) loop(ctx context.Context) {
	defer close(s.stopped)
	for {
		now := s.o.Clock.Now()
		s.Tick(ctx, now)
		wake := s.NextWake(now)
		select {
		case <-ctx.Done():
			return
		case <-s.o.Clock.After(wake.Sub(now)):
		}
	}
}

// NextWake is when the loop looks again after now: the next fire time of
// an enabled schedule, or now+Recheck if that is sooner.
func (s *Scheduler) NextWake(now time.Time) time.Time {
	wake := now.Add(s.o.Recheck)
	for _, sch := range s.schedules {
		if sch.Disabled {
			continue
		}
		if n := sch.Next(now); !n.IsZero() && n.Before(wake) {
			wake = n
		}
	}
	return wake
}
