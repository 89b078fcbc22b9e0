package bulkhead_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/lci-labs/compartment/bulkhead"
)

// The month-end story: three functions share a database pool of 20
// connections. Each gets its own compartment, so when the report batch
// floods, only the batch compartment fills and orders keep flowing.
func Example() {
	reg := bulkhead.NewRegistry()
	for _, c := range []bulkhead.Config{
		{Name: "order", MaxConcurrent: 8},
		{Name: "search", MaxConcurrent: 8},
		{Name: "batch", MaxConcurrent: 4},
	} {
		if _, err := reg.Register(c); err != nil {
			fmt.Println(err)
			return
		}
	}
	ctx := context.Background()
	batch, _ := reg.Get("batch")

	// Month-end: 50 reports arrive at once. Four run; the rest are turned
	// away at the door instead of queueing for connections.
	running := make(chan struct{})
	finish := make(chan struct{})
	done := make(chan struct{})
	for range 4 {
		go func() {
			_ = batch.Execute(ctx, func(context.Context) error {
				running <- struct{}{}
				<-finish
				return nil
			})
			done <- struct{}{}
		}()
	}
	for range 4 {
		<-running
	}
	rejected := 0
	var lastErr error
	for range 46 {
		if err := batch.Execute(ctx, func(context.Context) error { return nil }); errors.Is(err, bulkhead.ErrFull) {
			rejected++
			lastErr = err
		}
	}
	fmt.Println("reports rejected:", rejected)
	fmt.Println(lastErr)
	fmt.Println("batch full:", batch.IsFull(), "available:", batch.Available())

	// An order still runs: its compartment is untouched.
	order, _ := reg.Get("order")
	err := order.Execute(ctx, func(context.Context) error {
		fmt.Println("order placed; order slots free while it runs:", order.Available())
		return nil
	})
	fmt.Println("order error:", err)

	close(finish)
	for range 4 {
		<-done
	}
	fmt.Println("after the batch: available", batch.Available())
	// Output:
	// reports rejected: 46
	// bulkhead "batch" is full (4/4)
	// batch full: true available: 0
	// order placed; order slots free while it runs: 7
	// order error: <nil>
	// after the batch: available 4
}

// A caller that gets ErrFull can branch on it and read the numbers.
func ExampleFullError() {
	b, _ := bulkhead.New(bulkhead.Config{Name: "batch", MaxConcurrent: 1})
	b.TryAcquire()
	defer b.Release()

	err := b.Execute(context.Background(), func(context.Context) error { return nil })
	var fe *bulkhead.FullError
	if errors.As(err, &fe) {
		fmt.Printf("%s: %d of %d slots busy; try again later\n", fe.Name, fe.Active, fe.Max)
	}
	// Output: batch: 1 of 1 slots busy; try again later
}

// Do returns a value from work done inside a slot.
func ExampleDo() {
	search, _ := bulkhead.New(bulkhead.Config{Name: "search", MaxConcurrent: 8})
	hits, err := bulkhead.Do(context.Background(), search, func(context.Context) ([]string, error) {
		return []string{"teapot", "teacup"}, nil
	})
	fmt.Println(hits, err)
	// Output: [teapot teacup] <nil>
}

// New names every field that is wrong.
func ExampleNew() {
	_, err := bulkhead.New(bulkhead.Config{Name: "batch", MaxConcurrent: 0, MaxWait: -1})
	fmt.Println(err)
	// Output:
	// bulkhead "batch": MaxConcurrent must be >= 1, got 0
	// bulkhead "batch": MaxWait must be >= 0, got -1ns
}
