package queues_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/lci-labs/compartment/bulkhead"
	"github.com/lci-labs/compartment/priority"
	"github.com/lci-labs/compartment/queues"
)

// A service's own jobs: each a job type with its payload type.
type Welcome struct {
	Email string `json:"email"`
}

type Invoice struct {
	ID int `json:"id"`
}

var (
	sendWelcome   = queues.NewJob[Welcome]("email:welcome")
	renderInvoice = queues.NewJob[Invoice]("invoice:render")
)

// A service with two pools of its own: e-mails and invoices each run in
// their own compartment, so a flood of invoices can never take the slots
// the e-mails need. The handler and the enqueue of a job agree on its
// payload type at compile time.
func Example() {
	mr, _ := miniredis.Run() // an in-process Redis; use your own
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()

	done := make(chan string, 2)
	h := queues.NewHandlers()
	queues.AddHandler(h, sendWelcome, func(ctx context.Context, w Welcome) error {
		done <- "welcomed " + w.Email
		return nil
	})
	queues.AddHandler(h, renderInvoice, func(ctx context.Context, inv Invoice) error {
		done <- fmt.Sprintf("rendered invoice %d", inv.ID)
		return nil
	})

	client, err := queues.NewClient(rdb, queues.Config{
		Pools: []queues.PoolConfig{
			{Name: "email", Size: 4, JobTypes: []string{sendWelcome.Type()}, PollInterval: 10 * time.Millisecond},
			{Name: "invoices", Size: 2, JobTypes: []string{renderInvoice.Type()}, PollInterval: 10 * time.Millisecond},
		},
		Handlers: h,
		Logger:   slog.New(slog.DiscardHandler), // keep the example's output quiet
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	ctx := context.Background()
	if err := client.Start(ctx); err != nil {
		fmt.Println(err)
		return
	}
	defer client.Stop(ctx)

	queues.Enqueue(ctx, client, sendWelcome, Welcome{Email: "ada@example.com"}, queues.EnqueueOptions{})
	queues.Enqueue(ctx, client, renderInvoice, Invoice{ID: 42}, queues.EnqueueOptions{})
	got := []string{<-done, <-done}
	sort.Strings(got)
	fmt.Println(got)
	// Output: [rendered invoice 42 welcomed ada@example.com]
}

// Strict tiers: the business ranks the tiers, and a pool always starts a
// job of its highest non-empty tier first, first in, first out within a
// tier. Here three jobs wait before the pool of one slot starts.
func Example_strictTiers() {
	mr, _ := miniredis.Run()
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()

	tiers, _ := priority.New(priority.Config{Tiers: []string{"regulatory", "close", "adhoc"}, Default: "adhoc"})
	report := queues.NewJob[string]("report:run")
	started := make(chan string, 3)
	h := queues.NewHandlers()
	queues.AddHandler(h, report, func(ctx context.Context, name string) error {
		started <- name
		return nil
	})
	client, err := queues.NewClient(rdb, queues.Config{
		Tiers: tiers,
		Pools: []queues.PoolConfig{{Name: "batch", Size: 1, JobTypes: []string{report.Type()},
			Tiers: []string{"regulatory", "close", "adhoc"}, PollInterval: 10 * time.Millisecond}},
		Handlers: h,
		Logger:   slog.New(slog.DiscardHandler),
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	ctx := context.Background()
	queues.Enqueue(ctx, client, report, "refunds-analysis", queues.EnqueueOptions{}) // the default tier: adhoc
	queues.Enqueue(ctx, client, report, "trial-balance", queues.EnqueueOptions{Tier: "close"})
	queues.Enqueue(ctx, client, report, "vat-return", queues.EnqueueOptions{Tier: "regulatory"})

	if err := client.Start(ctx); err != nil {
		fmt.Println(err)
		return
	}
	defer client.Stop(ctx)
	for range 3 {
		fmt.Println(<-started)
	}
	// Output:
	// vat-return
	// trial-balance
	// refunds-analysis
}

// A full bulkhead fails fast, naming itself. A pool's bulkhead can be
// shared with code outside the queue (an HTTP handler of the same
// function, say): while the pool's one slot runs a job, the request is
// turned away at once instead of waiting for a connection.
func Example_fullBulkhead() {
	mr, _ := miniredis.Run()
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()

	order := queues.NewJob[int]("order:create")
	running, finish := make(chan struct{}), make(chan struct{})
	h := queues.NewHandlers()
	queues.AddHandler(h, order, func(ctx context.Context, id int) error {
		close(running)
		<-finish
		return nil
	})
	client, err := queues.NewClient(rdb, queues.Config{
		Pools:    []queues.PoolConfig{{Name: "order", Size: 1, JobTypes: []string{order.Type()}, PollInterval: 10 * time.Millisecond}},
		Handlers: h,
		Logger:   slog.New(slog.DiscardHandler),
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	ctx := context.Background()
	if err := client.Start(ctx); err != nil {
		fmt.Println(err)
		return
	}
	defer client.Stop(ctx)
	queues.Enqueue(ctx, client, order, 1, queues.EnqueueOptions{})
	<-running

	pool, _ := client.Pool("order")
	err = pool.Bulkhead().Execute(ctx, func(context.Context) error { return nil })
	fmt.Println(err)
	fmt.Println("full:", errors.Is(err, bulkhead.ErrFull))
	close(finish)
	// Output:
	// bulkhead "order" is full (1/1)
	// full: true
}

// A graceful stop: the pools stop taking jobs at once, and a job that is
// running gets the shutdown timeout to finish. Stop returns when every pool
// has stopped (or when its context ends first); Stopped tells the same to
// anyone else who waits.
func ExampleClient_Stop() {
	mr, _ := miniredis.Run()
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()

	export := queues.NewJob[string]("export:run")
	running := make(chan struct{})
	h := queues.NewHandlers()
	queues.AddHandler(h, export, func(ctx context.Context, name string) error {
		close(running)
		time.Sleep(50 * time.Millisecond) // work that finishes within the shutdown timeout
		fmt.Println("finished", name)
		return nil
	})
	client, err := queues.NewClient(rdb, queues.Config{
		Pools:           []queues.PoolConfig{{Name: "exports", Size: 2, JobTypes: []string{export.Type()}, PollInterval: 10 * time.Millisecond}},
		Handlers:        h,
		ShutdownTimeout: 10 * time.Second,
		Logger:          slog.New(slog.DiscardHandler),
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := client.Start(context.Background()); err != nil {
		fmt.Println(err)
		return
	}
	queues.Enqueue(context.Background(), client, export, "ledger.csv", queues.EnqueueOptions{})
	<-running

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	fmt.Println("stop:", client.Stop(ctx))
	<-client.Stopped()
	fmt.Println("stopped")
	// Output:
	// finished ledger.csv
	// stop: <nil>
	// stopped
}

// The door of a pool: at most three reports wait, ad-hoc ones only while
// fewer than two do. A refused enqueue enqueues nothing and says why.
func Example_door() {
	mr, _ := miniredis.Run()
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	tiers, _ := priority.New(priority.Config{Tiers: []string{"regulatory", "adhoc"}, Default: "adhoc"})
	client, _ := queues.NewClient(rdb, queues.Config{
		Tiers: tiers,
		Pools: []queues.PoolConfig{{
			Name: "batch", Size: 1, JobTypes: []string{"report"}, Tiers: []string{"regulatory", "adhoc"},
			MaxBacklog: 3, TierLimits: map[string]int{"adhoc": 2},
		}},
	})
	ctx := context.Background()
	for _, tier := range []string{"adhoc", "adhoc", "adhoc", "regulatory", "regulatory"} {
		_, err := client.Enqueue(ctx, "report", nil, queues.EnqueueOptions{Tier: tier})
		var full *queues.BacklogError
		switch {
		case errors.As(err, &full):
			fmt.Printf("%s: refused, room %d (%v)\n", tier, full.Tiers[0].Room, errors.Is(err, queues.ErrRefused))
		case err != nil:
			fmt.Println(err)
		default:
			fmt.Printf("%s: enqueued\n", tier)
		}
	}
	// Output:
	// adhoc: enqueued
	// adhoc: enqueued
	// adhoc: refused, room 0 (true)
	// regulatory: enqueued
	// regulatory: refused, room 0 (true)
}
