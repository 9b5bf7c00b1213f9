package dashshot

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/google/uuid"
	"golang.org/x/time/rate"

	"github.com/acme/orders/client"
)

// Defaults of LoadConfig.
const (
	// DefaultLoadRate is how many order journeys start per second.
	DefaultLoadRate = 12
	// DefaultLoadWorkers is how many journeys run at once at most.
	DefaultLoadWorkers = 8
	// DefaultJourneyTimeout bounds one journey (create, pay, wait for the
	// charge's outcome in the read model, ship).
	DefaultJourneyTimeout = 20 * time.Second
)

// LoadConfig holds the settings of Load. Zero values take the defaults.
type LoadConfig struct {
	Rate           float64
	Workers        int
	JourneyTimeout time.Duration
}

func (c *LoadConfig) validate() error {
	if c.Rate == 0 {
		c.Rate = DefaultLoadRate
	}
	if c.Workers == 0 {
		c.Workers = DefaultLoadWorkers
	}
	if c.JourneyTimeout == 0 {
		c.JourneyTimeout = DefaultJourneyTimeout
	}
	switch {
	case c.Rate < 0:
		return fmt.Errorf("dashshot: LoadConfig.Rate must be positive, got %v", c.Rate)
	case c.Workers < 0:
		return fmt.Errorf("dashshot: LoadConfig.Workers must be positive, got %d", c.Workers)
	case c.JourneyTimeout < 0:
		return fmt.Errorf("dashshot: LoadConfig.JourneyTimeout must be positive, got %s", c.JourneyTimeout)
	}
	return nil
}

// LoadStats counts what Load did.
type LoadStats struct {
	// Journeys started; Calls made through the client; BadRequests made on
	// purpose (each answered with the 4xx expected).
	Journeys, Calls, BadRequests int
	// Failures counts calls that failed unexpectedly; LastFailure is the
	// last of them.
	Failures    int
	LastFailure error
}

// Load drives the API through c until ctx ends: Rate journeys a second,
// up to Workers at once. A journey creates an order (one in five again with
// the same key: an idempotent replay), reads it back with min_version,
// pays it (one in six with a card the provider declines), waits for the
// charge's outcome in the read model, ships it if paid and lists the
// customer's orders; one in seven also asks for an order that does not
// exist (404) and sends an order without items (422), so the error panels
// show something. Load returns when ctx is done, with the counts, or at
// once with an error naming a bad setting.
func Load(ctx context.Context, c *client.Client, cfg LoadConfig) (LoadStats, error) {
	if err := cfg.validate(); err != nil {
		return LoadStats{}, err
	}
	var (
		mu    sync.Mutex
		stats LoadStats
		wg    sync.WaitGroup
	)
	record := func(calls, bad int, err error) {
		mu.Lock()
		defer mu.Unlock()
		stats.Calls += calls
		stats.BadRequests += bad
		if err != nil && ctx.Err() == nil {
			stats.Failures++
			stats.LastFailure = err
		}
	}
	lim := rate.NewLimiter(rate.Limit(cfg.Rate), 1)
	slots := make(chan struct{}, cfg.Workers)
	for n := 0; ; n++ {
		if err := lim.Wait(ctx); err != nil {
			break // ctx is done
		}
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
		mu.Lock()
		stats.Journeys++
		mu.Unlock()
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-slots }()
			jctx, cancel := context.WithTimeout(ctx, cfg.JourneyTimeout)
			defer cancel()
			calls, bad, err := journey(jctx, c, n)
			record(calls, bad, err)
		}()
	}
	wg.Wait()
	return stats, nil
}

// journey runs journey number n; it returns the calls made, the bad
// requests among them, and the first unexpected failure.
func journey(ctx context.Context, c *client.Client, n int) (calls, bad int, err error) {
	customer := fmt.Sprintf("dash-c-%d", n%25)
	if n%7 == 3 {
		calls, bad = calls+2, bad+2
		if _, err := c.GetOrder(ctx, uuid.NewString()); !client.IsNotFound(err) {
			return calls, bad, fmt.Errorf("get an unknown order: %v, want not found", err)
		}
		_, err := c.CreateOrder(ctx, client.NewOrder{CustomerID: customer, Currency: "EUR"})
		if p := client.AsProblem(err); p == nil || p.Status < 400 || p.Status >= 500 {
			return calls, bad, fmt.Errorf("create an order without items: %v, want a 4xx", err)
		}
	}
	key := uuid.NewString()
	order := client.NewOrder{CustomerID: customer, Currency: "EUR", Items: []client.NewItem{
		{SKU: fmt.Sprintf("sku-%d", n%9), Quantity: int64(1 + n%3), UnitPrice: int64(500 + 250*(n%5))},
	}}
	calls++
	o, err := c.CreateOrder(ctx, order, client.WithIdempotencyKey(key))
	if err != nil {
		return calls, bad, fmt.Errorf("create: %w", err)
	}
	if n%5 == 0 {
		calls++
		if _, err := c.CreateOrder(ctx, order, client.WithIdempotencyKey(key)); err != nil {
			return calls, bad, fmt.Errorf("replay create: %w", err)
		}
	}
	calls++
	if o, err = c.GetOrder(ctx, o.ID, client.WithMinVersion(o.Version)); err != nil {
		return calls, bad, fmt.Errorf("get with min_version: %w", err)
	}
	method := "pm_card_visa"
	if n%6 == 5 {
		method = "pm_card_chargeDeclined"
	}
	calls++
	if o, err = c.PayOrder(ctx, o.ID, method); err != nil {
		return calls, bad, fmt.Errorf("pay: %w", err)
	}
	// The charge's outcome is the next version; WaitForVersion counts as
	// one call however many GETs it takes.
	calls++
	if o, err = c.WaitForVersion(ctx, o.ID, o.Version+1); err != nil {
		return calls, bad, fmt.Errorf("wait for the charge: %w", err)
	}
	if o.Status == "paid" && n%2 == 0 {
		calls++
		if _, err := c.ShipOrder(ctx, o.ID); err != nil {
			return calls, bad, fmt.Errorf("ship: %w", err)
		}
	}
	if n%4 == 0 {
		calls++
		if _, err := c.ListOrders(ctx, client.ListOptions{CustomerID: customer, Limit: 10}); err != nil {
			return calls, bad, fmt.Errorf("list: %w", err)
		}
	}
	return calls, bad, nil
}
