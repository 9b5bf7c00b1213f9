package httpapi_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/acme/orders/domain"
	"github.com/acme/orders/query"
)

// insertView puts an order straight into the read model (no projector here).
func insertView(t *testing.T, a api, tenant, customer, status string, created time.Time) uuid.UUID {
	t.Helper()
	id := uuid.Must(uuid.NewV7())
	if _, err := a.db.Exec(context.Background(), `INSERT INTO order_views
		(tenant_id, order_id, customer_id, status, currency, items, total, version, created_at, updated_at)
		VALUES ($1, $2, $3, $4, 'EUR', '[]', 100, 1, $5, $5)`, tenant, id, customer, status, created); err != nil {
		t.Fatal(err)
	}
	return id
}

type pageOut struct {
	Orders []struct {
		ID         string `json:"id"`
		CustomerID string `json:"customer_id"`
		Status     string `json:"status"`
	} `json:"orders"`
	NextCursor *string `json:"next_cursor"`
}

// A walk in pages of 37 over 250 orders, while other orders are inserted
// all over the time range, returns every order that existed when it began
// exactly once.
func TestListOrdersPaginationIsStableUnderInserts(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	existing := map[string]int{}
	for i := range 250 {
		existing[insertView(t, a, "t1", "c", "pending", base.Add(time.Duration(i)*time.Minute)).String()] = 0
	}
	insertView(t, a, "t2", "c", "pending", base) // another tenant's: never listed

	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			insertView(t, a, "t1", "c", "pending", base.Add(time.Duration(i%250)*time.Minute+time.Second))
		}
	})

	cursor, pages := "", 0
	for {
		q := url.Values{"limit": {"37"}}
		if cursor != "" {
			q.Set("cursor", cursor)
		}
		res := a.do(t, http.MethodGet, "/v1/orders?"+q.Encode(), nil, "")
		if res.status != 200 || res.header.Get("Cache-Control") != "no-cache" {
			t.Fatalf("page %d: %d, Cache-Control %q (want no-cache, as every read of a read model) %s", pages, res.status, res.header.Get("Cache-Control"), res.body)
		}
		var p pageOut
		if err := json.Unmarshal(res.body, &p); err != nil {
			t.Fatal(err)
		}
		pages++
		if len(p.Orders) > 37 {
			t.Fatalf("page of %d orders", len(p.Orders))
		}
		for _, o := range p.Orders {
			if _, ok := existing[o.ID]; ok {
				existing[o.ID]++
			}
		}
		if p.NextCursor == nil {
			break
		}
		cursor = *p.NextCursor
	}
	close(stop)
	wg.Wait()
	for id, n := range existing {
		if n != 1 {
			t.Fatalf("order %s listed %d times, want once", id, n)
		}
	}
	if pages < 7 {
		t.Fatalf("%d pages for 250+ orders in pages of 37", pages)
	}
}

func TestListOrdersFilters(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	insertView(t, a, "t1", "alice", "pending", base)
	insertView(t, a, "t1", "alice", "paid", base.Add(time.Hour))
	insertView(t, a, "t1", "bob", "paid", base.Add(2*time.Hour))
	for _, tt := range []struct {
		query string
		want  int
	}{
		{"", 3},
		{"customer_id=alice", 2},
		{"status=paid", 2},
		{"customer_id=alice&status=paid", 1},
		{"created_after=" + url.QueryEscape(base.Add(30*time.Minute).Format(time.RFC3339)), 2},
		{"created_after=" + url.QueryEscape(strings.ToLower(base.Add(30*time.Minute).UTC().Format(time.RFC3339))), 2}, // RFC 3339 allows t and z
		{"customer_id=nobody", 0},
	} {
		res := a.do(t, http.MethodGet, "/v1/orders?"+tt.query, nil, "")
		var p pageOut
		if err := json.Unmarshal(res.body, &p); err != nil || res.status != 200 || len(p.Orders) != tt.want || p.NextCursor != nil {
			t.Fatalf("?%s: %d %s; want %d orders", tt.query, res.status, res.body, tt.want)
		}
	}
	for _, bad := range []string{"limit=0", "limit=101", "limit=x", "status=lost", "created_after=yesterday", "cursor=garbage",
		"customer_id=%00", "customer_id=%FF%FE", "customer_id=" + strings.Repeat("c", 65),
		"cursor=" + fmt.Sprint(uuid.New())} {
		if res := a.do(t, http.MethodGet, "/v1/orders?"+bad, nil, ""); res.status != 400 {
			t.Fatalf("?%s: %d %s; want 400", bad, res.status, res.body)
		}
	}
	// Said twice, said with nothing, or not decodable: refused naming the
	// parameter (the first value, or no limit at all, was taken).
	for _, tt := range []struct{ path, field string }{
		{"/v1/orders?limit=1&limit=2", "limit"},
		{"/v1/orders?status=paid&status=pending", "status"},
		{"/v1/orders?limit=", "limit"},
		{"/v1/orders?cursor=&limit=1", "cursor"},
		{"/v1/orders?limit=%zz", ""},
		{"/v1/orders/" + uuid.NewString() + "?min_version=1&min_version=2", "min_version"},
		{"/v1/reports/daily-sales?from=2026-01-01&from=2026-01-02&to=2026-01-03", "from"},
	} {
		expectProblem(t, tt.path, a.do(t, http.MethodGet, tt.path, nil, ""), http.StatusBadRequest, "invalid-parameter", tt.field)
	}
}

// A page filtered by status examines at most its scan's worth of orders:
// a walk over 60 orders, 7 of them paid and scattered, in pages of 2 that
// each examine at most 10 orders, comes back in short (even empty) pages
// that still carry a cursor, and returns each paid order exactly once, in
// order, with the walk ending on a page without a cursor. Another
// customer's and another tenant's paid orders are never listed.
func TestListOrdersByStatusExaminesABoundedNumberOfOrdersPerPage(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var want []uuid.UUID
	for i := range 60 {
		status := "pending"
		if i%9 == 4 || i == 59 {
			status = "paid"
		}
		id := insertView(t, a, "t1", "alice", status, base.Add(time.Duration(i)*time.Minute))
		if status == "paid" {
			want = append(want, id)
		}
	}
	insertView(t, a, "t1", "bob", "paid", base.Add(30*time.Second))
	insertView(t, a, "t2", "alice", "paid", base.Add(90*time.Second))

	h := query.NewListOrdersHandler(a.db).WithStatusScan(10)
	var got []uuid.UUID
	q := query.ListOrders{TenantID: "t1", CustomerID: "alice", Status: domain.StatusPaid, Limit: 2}
	pages := 0
	for {
		page, err := h.Handle(context.Background(), q)
		if err != nil {
			t.Fatal(err)
		}
		pages++
		if len(page.Orders) > 2 {
			t.Fatalf("page %d holds %d orders, want at most 2", pages, len(page.Orders))
		}
		for _, o := range page.Orders {
			if o.Status != domain.StatusPaid || o.TenantID != "t1" || o.CustomerID != "alice" {
				t.Fatalf("page %d lists %+v", pages, o)
			}
			got = append(got, o.ID)
		}
		if page.Next == nil {
			break
		}
		if pages > 60 {
			t.Fatal("the walk does not end")
		}
		q.After = page.Next
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("walked %v\nwant      %v", got, want)
	}
	// 60 orders, at most 10 examined per page: at least 6 pages, and the
	// last one examines what is left (none of them past the 60th).
	if pages < 6 || pages > 8 {
		t.Errorf("the walk took %d pages, want 6 to 8 (10 orders examined per page)", pages)
	}
}
