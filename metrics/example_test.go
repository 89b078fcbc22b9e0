package metrics_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/lci-labs/compartment/metrics"
	"github.com/lci-labs/compartment/queues"
)

// A client's pools exported to Prometheus: the metrics are the client's
// Observer and count its breakers' changes (OnBreakerChange), Watch adds
// its queues, Handler serves the scrape.
func Example() {
	mr, _ := miniredis.Run() // an in-process Redis; use your own
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()

	m := metrics.New()
	h := queues.NewHandlers()
	h.HandleFunc("email:welcome", func(context.Context, *asynq.Task) error { return nil })
	client, err := queues.NewClient(rdb, queues.Config{
		Pools:           []queues.PoolConfig{{Name: "email", Size: 4, JobTypes: []string{"email:welcome"}, PollInterval: 10 * time.Millisecond}},
		Handlers:        h,
		Observer:        m,
		OnBreakerChange: m.BreakerChanged,
		Logger:          slog.New(slog.DiscardHandler),
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := m.Watch(client); err != nil {
		fmt.Println(err)
		return
	}
	ctx := context.Background()
	if err := client.Start(ctx); err != nil {
		fmt.Println(err)
		return
	}
	defer client.Stop(ctx)
	srv := httptest.NewServer(m.Handler()) // or http.Handle("/metrics", m.Handler())
	defer srv.Close()

	if _, err := client.Enqueue(ctx, "email:welcome", []byte(`{}`), queues.EnqueueOptions{}); err != nil {
		fmt.Println(err)
		return
	}
	want := `compartment_jobs_total{outcome="succeeded",pool="email",tier=""} 1`
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		resp, err := srv.Client().Get(srv.URL)
		if err != nil {
			fmt.Println(err)
			return
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if strings.Contains(string(body), want) {
			for _, line := range strings.Split(string(body), "\n") {
				if strings.HasPrefix(line, "compartment_pool_size") || strings.HasPrefix(line, "compartment_job_wait_seconds_count") || line == want {
					fmt.Println(line)
				}
			}
			return
		}
	}
	fmt.Println("the job was not counted")
	// Output:
	// compartment_job_wait_seconds_count{pool="email",tier=""} 1
	// compartment_jobs_total{outcome="succeeded",pool="email",tier=""} 1
	// compartment_pool_size{pool="email"} 4
}
