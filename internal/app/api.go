package app

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/acme/orders/auth"
	"github.com/acme/orders/command"
	"github.com/acme/orders/health"
	"github.com/acme/orders/httpapi"
	"github.com/acme/orders/metrics"
	"github.com/acme/orders/outbox"
	"github.com/acme/orders/postgres"
	"github.com/acme/orders/query"
	"github.com/acme/orders/stream"
	"github.com/acme/orders/tracing"
)

// MaxIdempotencyWait is the longest -idempotency-wait: a request waits at
// most three of them for a key (command.Idempotency), and its answer must
// still fit the server's write timeout.
const MaxIdempotencyWait = serverWriteTimeout / 4

// serverWriteTimeout bounds the time from a request's headers to the end
// of its response.
const serverWriteTimeout = 60 * time.Second

const apiUsage = `usage:
  api [flags]                                  serve the REST API (and the outbox relay)
  api migrate [flags]                          apply the schema migrations and exit
  api token create -tenant NAME [-name LABEL] [-expires DURATION]
                                               register a client of tenant NAME and print its token
  api token revoke -token TOKEN                revoke that token
  api token revoke -tenant NAME -name LABEL    revoke every token of tenant NAME labelled LABEL`

type apiConfig struct {
	databaseURL, natsURL, httpAddr string
	relay                          bool
	keyTTL, keyWait, janitorEvery  time.Duration
	keyQuota, keyQuotaBytes        int
	healthInterval                 time.Duration
	keyQuotaRefresh                time.Duration
	replicas, poolSize             int
	tenantDBShare                  int
	createGroupSlots               int
	maxInFlight                    int
	maxConns                       int
	tenantLimits                   httpapi.TenantLimitConfig
	bodyTimeout, tokenCacheTTL     time.Duration
	acceptLegacyTokens             bool
	relayPartitions, relayWorkers  int
	relayBatch, relayMinAtomic     int
	relayRetention, relayPoll      time.Duration
	logFormat, logLevel            string
	pprofAddr                      string
	tenant, clientName             string        // token create, revoke
	tokenExpires                   time.Duration // token create
	token                          string        // token revoke
	tracing                        tracing.Config
}

// parseAPIConfig reads the settings of one api subcommand ("", "migrate" or
// "token create") from the environment and args.
func parseAPIConfig(sub string, args []string, env *Env) (apiConfig, error) {
	fs := flag.NewFlagSet("api "+sub, flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), apiUsage)
		fs.PrintDefaults()
	}
	c := apiConfig{}
	databaseURL := env.String(fs, "database-url", "DATABASE_URL", DefaultDatabaseURL, "PostgreSQL connection URL")
	logFormat := env.String(fs, "log-format", "LOG_FORMAT", "", "log format: json or text (default: text on a terminal)")
	logLevel := env.String(fs, "log-level", "LOG_LEVEL", "info", "log level: debug, info, warn, error")
	var natsURL, httpAddr, tenant, name, token *string
	var expires *time.Duration
	var relay, acceptLegacy *bool
	var replicas, poolSize, maxInFlight, maxConns, relayPartitions, relayWorkers, relayBatch, relayMinAtomic *int
	var tenantInFlight, tenantWaiting, tenantRate, tenantBurst, tenantBytes, tenantDBShare, createGroupSlots *int
	var bodyTimeout, tokenCacheTTL *time.Duration
	var relayRetention, relayPoll *time.Duration
	var keyTTL, keyWait, janitorEvery, keyQuotaRefresh *time.Duration
	var keyQuota, keyQuotaBytes *int
	var pprofAddr *string
	var healthInterval *time.Duration
	switch sub {
	case "":
		natsURL = env.String(fs, "nats-url", "NATS_URL", DefaultNATSURL, "NATS server URL")
		httpAddr = env.String(fs, "http-addr", "HTTP_ADDR", ":8080", "address to serve HTTP on")
		relay = env.Bool(fs, "relay", "RELAY", true, "run the outbox relay in this process")
		keyTTL = env.Duration(fs, "idempotency-ttl", "IDEMPOTENCY_TTL", command.DefaultKeyTTL, "how long an Idempotency-Key is remembered after its first use")
		keyQuota = env.Int(fs, "idempotency-key-quota", "IDEMPOTENCY_KEY_QUOTA", command.DefaultKeyQuota, "most Idempotency-Keys one tenant may have stored; past it new keys get 429")
		keyQuotaBytes = env.Int(fs, "idempotency-key-quota-bytes", "IDEMPOTENCY_KEY_QUOTA_BYTES", command.DefaultKeyQuotaBytes, "most bytes of Idempotency-Keys (their stored requests and responses) one tenant may have stored; past it new keys get 429")
		keyQuotaRefresh = env.Duration(fs, "idempotency-key-quota-refresh", "IDEMPOTENCY_KEY_QUOTA_REFRESH", command.DefaultKeyQuotaRefresh, "how often each api recounts a tenant's stored keys")
		keyWait = env.Duration(fs, "idempotency-wait", "IDEMPOTENCY_WAIT", httpapi.DefaultKeyWait, "how long a request waits for an in-flight request with its key")
		janitorEvery = env.Duration(fs, "idempotency-janitor-interval", "IDEMPOTENCY_JANITOR_INTERVAL", DefaultJanitorInterval, "how often expired keys are deleted")
		healthInterval = env.Duration(fs, "health-interval", "HEALTH_INTERVAL", health.DefaultInterval, "how often the readiness checks behind /readyz run")
		replicas = env.Int(fs, "stream-replicas", "STREAM_REPLICAS", stream.DefaultReplicas, "replicas of the JetStream stream (3 on a cluster)")
		poolSize = env.Int(fs, "db-pool-size", "DB_POOL_SIZE", DefaultAPIPoolSize, "most PostgreSQL connections of this process")
		maxConns = env.Int(fs, "max-conns", "MAX_CONNS", DefaultAPIMaxConns, "most client connections open at once; past it the longest-idle one is closed, or a new one waits in the kernel's accept queue")
		maxInFlight = env.Int(fs, "max-in-flight", "MAX_IN_FLIGHT", httpapi.DefaultMaxInFlight, "most /v1 requests served at once; the rest get 429 with Retry-After")
		tenantInFlight = env.Int(fs, "tenant-max-in-flight", "TENANT_MAX_IN_FLIGHT", httpapi.DefaultTenantMaxInFlight, "most /v1 requests of one tenant served at once; its excess gets 429 tenant-overloaded")
		tenantDBShare = env.Int(fs, "tenant-db-share", "TENANT_DB_SHARE", 0, "most of this api's PostgreSQL connections one tenant's requests hold at once, its other requests waiting for them (0: three quarters of what -create-group-slots leave of -db-pool-size; at most what they leave)")
		createGroupSlots = env.Int(fs, "create-group-slots", "CREATE_GROUP_SLOTS", -1, fmt.Sprintf("most batches of concurrent creates committing at once, each one transaction and one WAL flush for its creates, at most half the pool's connections (0: every create commits alone; -1: %d, or half the pool if smaller)", DefaultCreateGroupSlots))
		tenantWaiting = env.Int(fs, "tenant-max-waiting", "TENANT_MAX_WAITING", httpapi.DefaultTenantMaxWaiting, "most reads with min_version or min_position of one tenant in flight at once (at most -tenant-max-in-flight)")
		tenantRate = env.Int(fs, "tenant-rate", "TENANT_RATE", int(httpapi.DefaultTenantRate), "requests per second of one tenant (token bucket); its excess gets 429 tenant-rate-limited")
		tenantBurst = env.Int(fs, "tenant-burst", "TENANT_BURST", httpapi.DefaultTenantBurst, "token bucket size of -tenant-rate")
		tenantBytes = env.Int(fs, "tenant-bytes-per-token", "TENANT_BYTES_PER_TOKEN", httpapi.DefaultTenantBytesPerToken,
			"a request costs its tenant one more token of -tenant-rate per this many bytes of its body and response, taken after it is sent")
		bodyTimeout = env.Duration(fs, "body-timeout", "BODY_TIMEOUT", httpapi.DefaultBodyTimeout, "how long a request body may take to arrive; slower ones get 408")
		tokenCacheTTL = env.Duration(fs, "token-cache-ttl", "TOKEN_CACHE_TTL", auth.DefaultCacheTTL, "how long a token's tenant is cached fresh: a token revoked elsewhere works here this long plus one background re-read")
		acceptLegacy = env.Bool(fs, "accept-legacy-tokens", "ACCEPT_LEGACY_TOKENS", false, "accept tokens made before tokens had a checksum (each forged one then costs a database query)")
		relayPartitions = env.Int(fs, "relay-partitions", "RELAY_PARTITIONS", outbox.DefaultMaxPartitions, fmt.Sprintf("outbox partitions (of %d) this relay publishes while other relays have room; past it, it takes only those no relay with room takes, and gives them back when one wants them", outbox.Partitions))
		relayWorkers = env.Int(fs, "relay-workers", "RELAY_WORKERS", outbox.DefaultWorkers, "relay workers in this process (each owns a share of its partitions)")
		relayBatch = env.Int(fs, "relay-batch", "RELAY_BATCH", outbox.DefaultBatchSize, fmt.Sprintf("outbox rows per relay batch (1 to %d)", outbox.MaxBatchSize))
		relayMinAtomic = env.Int(fs, "relay-min-atomic-batch", "RELAY_MIN_ATOMIC_BATCH", outbox.DefaultMinAtomicBatch, "fewest events a relay batch holds to go out as one JetStream atomic batch (at least 2; smaller batches go message by message; above -relay-batch: never)")
		relayRetention = env.Duration(fs, "relay-retention", "RELAY_RETENTION", 0, "prune published outbox rows after this long (0: keep; rebuilds need them)")
		relayPoll = env.Duration(fs, "relay-poll-interval", "RELAY_POLL_INTERVAL", outbox.DefaultPollInterval, "how often the relay looks at the outbox when no wake-up came (a commit of this or another process wakes it at once; this bounds what a lost wake-up costs)")
		pprofAddr = env.String(fs, "pprof-addr", "PPROF_ADDR", "", pprofUsage)
	case "token create":
		tenant = fs.String("tenant", "", "tenant the new client acts for (a-z, 0-9, -, _)")
		name = fs.String("name", "cli", "a label for the client")
		expires = fs.Duration("expires", 0, "the token stops working after this long (0: never)")
	case "token revoke":
		token = fs.String("token", "", "the token to revoke")
		tenant = fs.String("tenant", "", "with -name: revoke this tenant's tokens labelled -name")
		name = fs.String("name", "", "the label of the tokens to revoke (with -tenant)")
	}
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if err := env.Err(); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected argument %q\n%s", fs.Arg(0), apiUsage)
	}
	c.databaseURL, c.logFormat, c.logLevel = *databaseURL, *logFormat, *logLevel
	c.tracing = env.Tracing("orders-api")
	switch sub {
	case "":
		c.natsURL, c.httpAddr, c.relay = *natsURL, *httpAddr, *relay
		c.keyTTL, c.keyWait, c.janitorEvery = *keyTTL, *keyWait, *janitorEvery
		c.keyQuota, c.keyQuotaBytes, c.keyQuotaRefresh = *keyQuota, *keyQuotaBytes, *keyQuotaRefresh
		c.healthInterval = *healthInterval
		c.replicas, c.poolSize, c.maxInFlight, c.maxConns = *replicas, *poolSize, *maxInFlight, *maxConns
		c.relayPartitions, c.relayWorkers, c.relayRetention, c.relayPoll = *relayPartitions, *relayWorkers, *relayRetention, *relayPoll
		c.pprofAddr = *pprofAddr
		c.relayBatch, c.relayMinAtomic = *relayBatch, *relayMinAtomic
		c.tenantLimits = httpapi.TenantLimitConfig{
			MaxInFlight: *tenantInFlight, MaxWaiting: *tenantWaiting, Rate: float64(*tenantRate), Burst: *tenantBurst,
			BytesPerToken: *tenantBytes,
		}
		c.bodyTimeout, c.tokenCacheTTL, c.acceptLegacyTokens = *bodyTimeout, *tokenCacheTTL, *acceptLegacy
		c.tenantDBShare = *tenantDBShare // 0: from the pool's size, once it is open
		c.createGroupSlots = *createGroupSlots
		switch {
		case c.keyTTL < time.Second:
			return c, fmt.Errorf("-idempotency-ttl must be at least 1s, got %s", c.keyTTL)
		case c.keyQuota < 1 || c.keyQuotaBytes < 1:
			// 0 too: as a Config field it means the default, which a
			// user who wrote 0 (no quota? no keys?) did not ask for.
			return c, fmt.Errorf("-idempotency-key-quota (IDEMPOTENCY_KEY_QUOTA) and -idempotency-key-quota-bytes (IDEMPOTENCY_KEY_QUOTA_BYTES) must be at least 1, got %d and %d (the defaults are %d and %d)",
				c.keyQuota, c.keyQuotaBytes, command.DefaultKeyQuota, command.DefaultKeyQuotaBytes)
		case c.janitorEvery <= 0:
			// No janitor: expired keys would count against their tenants'
			// key quotas for good.
			return c, fmt.Errorf("-idempotency-janitor-interval must be positive, got %s", c.janitorEvery)
		case c.keyWait < 0 || c.keyWait > MaxIdempotencyWait:
			return c, fmt.Errorf("-idempotency-wait must be 0 to %s (a request may wait three times as long, within the server's %s write timeout), got %s",
				MaxIdempotencyWait, serverWriteTimeout, c.keyWait)
		case c.replicas < 1 || c.replicas > stream.MaxReplicas:
			return c, fmt.Errorf("-stream-replicas must be 1 to %d, got %d", stream.MaxReplicas, c.replicas)
		case c.poolSize < 4 || c.poolSize > MaxPoolSize:
			return c, fmt.Errorf("-db-pool-size must be 4 to %d, got %d", MaxPoolSize, c.poolSize)
		case c.createGroupSlots < -1:
			return c, fmt.Errorf("-create-group-slots must be -1 (the default), 0 (off) or more, got %d", c.createGroupSlots)
		case c.tenantDBShare < 0:
			return c, fmt.Errorf("-tenant-db-share must not be negative, got %d", c.tenantDBShare)
		case c.maxInFlight < 1:
			return c, fmt.Errorf("-max-in-flight must be at least 1, got %d", c.maxInFlight)
		case c.maxConns > MaxAPIConns:
			return c, fmt.Errorf("-max-conns must be at most %d, got %d", MaxAPIConns, c.maxConns)
		case c.maxConns < c.maxInFlight:
			return c, fmt.Errorf("-max-conns must be at least -max-in-flight (%d), got %d: every request in flight needs a connection", c.maxInFlight, c.maxConns)
		case c.tenantLimits.MaxInFlight < 1 || c.tenantLimits.MaxInFlight >= c.maxInFlight:
			return c, fmt.Errorf("-tenant-max-in-flight must be 1 to -max-in-flight - 1 (%d), got %d: no tenant may fill the global limit", c.maxInFlight-1, c.tenantLimits.MaxInFlight)
		case c.tenantLimits.MaxWaiting < 1 || c.tenantLimits.MaxWaiting > c.tenantLimits.MaxInFlight:
			return c, fmt.Errorf("-tenant-max-waiting must be 1 to -tenant-max-in-flight (%d), got %d", c.tenantLimits.MaxInFlight, c.tenantLimits.MaxWaiting)
		case c.tenantLimits.Rate < 1 || c.tenantLimits.Burst < 1:
			return c, fmt.Errorf("-tenant-rate and -tenant-burst must be at least 1, got %v and %d", c.tenantLimits.Rate, c.tenantLimits.Burst)
		case c.tenantLimits.BytesPerToken < 1024:
			return c, fmt.Errorf("-tenant-bytes-per-token must be at least 1024 (one token per response KiB at most), got %d", c.tenantLimits.BytesPerToken)
		case c.bodyTimeout <= 0:
			return c, fmt.Errorf("-body-timeout must be positive, got %s", c.bodyTimeout)
		case requestTimeout(c.keyWait, c.bodyTimeout) < legitimateWaits(c.keyWait):
			return c, fmt.Errorf("-body-timeout %s leaves too little of the server's %s write timeout for three -idempotency-wait (%s) or a read wait (%s): at most %s",
				c.bodyTimeout, serverWriteTimeout, c.keyWait, httpapi.MaxReadWait, serverWriteTimeout-5*time.Second-legitimateWaits(c.keyWait))
		case c.tokenCacheTTL <= 0:
			return c, fmt.Errorf("-token-cache-ttl must be positive, got %s", c.tokenCacheTTL)
		case c.relayPartitions < 1 || c.relayPartitions > outbox.Partitions:
			return c, fmt.Errorf("-relay-partitions must be 1 to %d, got %d", outbox.Partitions, c.relayPartitions)
		case c.relayWorkers < 1 || c.relayWorkers > c.relayPartitions:
			return c, fmt.Errorf("-relay-workers must be 1 to -relay-partitions (%d), got %d", c.relayPartitions, c.relayWorkers)
		case c.relayBatch < 1 || c.relayBatch > outbox.MaxBatchSize:
			return c, fmt.Errorf("-relay-batch must be 1 to %d, got %d", outbox.MaxBatchSize, c.relayBatch)
		case c.relayMinAtomic < 2:
			return c, fmt.Errorf("-relay-min-atomic-batch must be at least 2, got %d", c.relayMinAtomic)
		case c.relayRetention < 0:
			return c, fmt.Errorf("-relay-retention must not be negative, got %s", c.relayRetention)
		case c.relayPoll < 10*time.Millisecond || c.relayPoll > time.Minute:
			// Shorter, each worker loops on empty claims; longer, an idle
			// relay is slow to publish what a lost wake-up left.
			return c, fmt.Errorf("-relay-poll-interval must be 10ms to 1m, got %s", c.relayPoll)
		}
	case "token create":
		if *tenant == "" {
			return c, fmt.Errorf("token create needs -tenant NAME\n%s", apiUsage)
		}
		if *expires < 0 {
			return c, fmt.Errorf("-expires must not be negative, got %s", *expires)
		}
		c.tenant, c.clientName, c.tokenExpires = *tenant, *name, *expires
	case "token revoke":
		if (*token == "") == (*tenant == "" || *name == "") {
			return c, fmt.Errorf("token revoke needs -token TOKEN, or -tenant NAME and -name LABEL\n%s", apiUsage)
		}
		c.token, c.tenant, c.clientName = *token, *tenant, *name
	}
	return c, nil
}

// RunAPI is the whole api program (cmd/api): it serves the REST API and,
// unless -relay=false, relays the outbox; "api migrate" only applies the
// migrations and "api token create" registers a client (see apiUsage). It
// returns when ctx ends, after a graceful shutdown. Tests call it with their
// own arguments, environment and output.
func RunAPI(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	return runAPI(ctx, args, getenv, stdout, false)
}

// RunAPIProcess is RunAPI for an api that has its process to itself
// (cmd/api): serving, it also keeps the process's soft memory limit at
// its budget, APIMemoryLimit(-max-conns), and its GOGC at GCPercent,
// unless GOMEMLIMIT is set (keepMemoryBudget). Tests run RunAPI, which
// leaves their process's settings alone.
func RunAPIProcess(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	return runAPI(ctx, args, getenv, stdout, true)
}

func runAPI(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer, process bool) error {
	sub, rest := "", args[1:]
	switch {
	case len(rest) > 0 && rest[0] == "migrate":
		sub, rest = "migrate", rest[1:]
	case len(rest) > 1 && rest[0] == "token" && rest[1] == "create":
		sub, rest = "token create", rest[2:]
	case len(rest) > 1 && rest[0] == "token" && rest[1] == "revoke":
		sub, rest = "token revoke", rest[2:]
	case len(rest) > 1 && rest[0] == "token" && isHelp(rest[1]):
		fmt.Fprintln(os.Stderr, apiUsage)
		return nil
	case len(rest) > 0 && rest[0] == "token":
		return fmt.Errorf("unknown token command\n%s", apiUsage)
	}
	cfg, err := parseAPIConfig(sub, rest, NewEnv(getenv))
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	if err != nil {
		return err
	}
	if err := CheckLogFlags(cfg.logFormat, cfg.logLevel); err != nil {
		return err
	}
	logger := NewLogger(stdout, cfg.logFormat, cfg.logLevel).With("process", "api")
	if sub == "token create" || sub == "token revoke" {
		// The token goes to stdout alone; warnings (a database not
		// reachable yet, retried for a while) go to stderr.
		logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	if sub == "" {
		if process {
			defer keepMemoryBudget(getenv, APIMemoryLimit(cfg.maxConns), "-max-conns", logger)()
		}
		servePprof(ctx, cfg.pprofAddr, logger)
		stopTracing, err := startTracing(ctx, cfg.tracing, logger)
		if err != nil {
			return err
		}
		defer stopTracing() // last: after the relay's and the requests' spans ended
	}

	// Serving waits for the database as long as it takes; a one-off command
	// gives up after about 10 s (openDB).
	pool, err := openDB(ctx, cfg.databaseURL, cfg.poolSize, sub != "", logger)
	if err != nil {
		return err
	}
	defer closeDB(pool, logger)
	switch sub {
	case "migrate":
		logger.Info("migrations applied")
		return nil
	case "token create":
		token, err := auth.NewClients(pool, 0).Create(ctx, auth.NewClient{Tenant: cfg.tenant, Name: cfg.clientName, ExpiresIn: cfg.tokenExpires})
		if err != nil {
			return err
		}
		fmt.Fprintln(stdout, token)
		return nil
	case "token revoke":
		n, err := auth.NewClients(pool, 0).Revoke(ctx, auth.Revocation{Token: cfg.token, Tenant: cfg.tenant, Name: cfg.clientName})
		if err != nil {
			return err
		}
		// Other api processes cache a token's tenant for -token-cache-ttl.
		fmt.Fprintf(stdout, "revoked %d token(s); api processes refuse them within their -token-cache-ttl\n", n)
		return nil
	}
	return serveAPI(ctx, cfg, pool, logger)
}

func serveAPI(ctx context.Context, cfg apiConfig, pool *pgxpool.Pool, logger *slog.Logger) error {
	nc, err := ConnectNATS(cfg.natsURL, "orders-api", logger)
	if err != nil {
		return err
	}
	defer CloseNATS(nc, logger)

	reg := metrics.NewRegistry()
	keyWait := prometheus.NewHistogram(metrics.HistogramOpts("idempotency_wait_seconds",
		"how long requests held up by an in-flight request with their key waited (those answered 409 included)", metrics.LatencyBuckets))
	reg.MustRegister(keyWait)
	// After a command commits, its events wake the relay: the one in this
	// process directly (set below, before the server starts), and the
	// relays of other processes (another api's, a standalone one), which
	// own the partitions this one does not, by a coalesced NOTIFY outbox;
	// never a NOTIFY inside the write transaction.
	var wakeRelay func()
	// A tenant's requests hold at most their share of the pool's
	// connections (G9); the relay, health checks and token look-ups are
	// not a tenant's, and use the pool as it is.
	// The pool's own size: a pool_max_conns in DATABASE_URL wins over
	// -db-pool-size.
	poolMax := int(pool.Config().MaxConns)
	// The group commit's batches (their creates are many tenants') count
	// against no tenant's share, so tenants hold at most what they leave,
	// and one tenant three quarters of that: the last quarter only goes
	// to a tenant that holds no connection (postgres.Shares).
	groupSlots, err := createGroupSlots(cfg.createGroupSlots, poolMax)
	if err != nil {
		return err
	}
	tenantConns := poolMax - groupSlots
	share := cfg.tenantDBShare
	if share == 0 {
		share = max(1, tenantConns*3/4)
	}
	if share > tenantConns {
		// A share past what tenants may hold together was accepted before
		// that bound: keep such a configuration starting.
		logger.Warn("-tenant-db-share is past what the create group's slots leave of the pool; using that", "share", share, "pool", poolMax, "group_slots", groupSlots, "using", tenantConns)
		share = tenantConns
	}
	shares, err := postgres.NewShares(pool, tenantConns, share)
	if err != nil {
		return err
	}
	idem, err := command.NewIdempotency(shares, command.IdempotencyConfig{
		TTL: cfg.keyTTL, KeyQuota: cfg.keyQuota, KeyQuotaBytes: int64(cfg.keyQuotaBytes), KeyQuotaRefresh: cfg.keyQuotaRefresh, WaitSeconds: keyWait,
		AfterCommit: func() { wakeRelay() },
		GroupSlots:  groupSlots,
	})
	if err != nil {
		return err
	}
	counter := func(name, help string, f func() int64) metrics.Metric {
		return metrics.Metric{Name: name, Help: help, Counter: true, Read: metrics.One(f)}
	}
	ms := []metrics.Metric{
		counter("idempotency_keys_created_total", "keyed commands executed and stored", func() int64 { return idem.Stats().Created }),
		counter("idempotency_replays_total", "stored responses replayed", func() int64 { return idem.Stats().Replays }),
		counter("idempotency_mismatches_total", "keys refused for a different request", func() int64 { return idem.Stats().Mismatches }),
		counter("idempotency_waits_total", "requests held up by an in-flight request with their key", func() int64 { return idem.Stats().Waits }),
		counter("idempotency_wait_timeouts_total", "requests answered 409 after waiting", func() int64 { return idem.Stats().WaitTimeouts }),
		counter("create_group_batches_total", "batches of creates committed together", func() int64 { return idem.GroupStats().Batches }),
		counter("create_group_creates_total", "creates committed in those batches", func() int64 { return idem.GroupStats().Grouped }),
		counter("create_group_alone_total", "creates sent alone: their batch failed, or their tenant was struck for failing one", func() int64 { return idem.GroupStats().Alone }),
		counter("create_group_failed_batches_total", "batches of creates that failed (sent again without the failing tenant's creates, or all alone)", func() int64 { return idem.GroupStats().Failed }),
	}

	// Background work stops after the HTTP server has drained.
	var wg sync.WaitGroup
	bgCtx, stopBackground := context.WithCancel(context.WithoutCancel(ctx))
	defer func() {
		start := time.Now()
		stopBackground()
		wg.Wait()
		logger.Info("shutdown: background work stopped (relay batches committed and marked, partitions released, listeners closed)",
			"duration", time.Since(start))
	}()

	janitor := &keyJanitor{keys: idem, every: cfg.janitorEvery, logger: logger.With("component", "janitor")}
	ms = append(ms, counter("idempotency_expired_keys_deleted_total", "expired keys deleted by this replica's janitor", janitor.deleted.Load))
	wg.Go(func() { janitor.run(bgCtx) })

	notifier, err := postgres.NewNotifier(pool, logger.With("component", "notifier"), postgres.NotifierConfig{Channel: "outbox"})
	if err != nil {
		return err
	}
	wg.Go(func() { notifier.Run(bgCtx) })
	if cfg.relay {
		js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(1024), jetstream.WithPublishAsyncTimeout(10*time.Second))
		if err != nil {
			return fmt.Errorf("jetstream: %w", err)
		}
		// One relay with several workers, each owning its share of the
		// partitions on its own connection, so that one claims and marks in
		// the database while another waits for PubAcks.
		publish := prometheus.NewHistogram(metrics.HistogramOpts("relay_publish_seconds",
			"time to publish one relay batch, from its first message to its last PubAck", metrics.LatencyBuckets))
		delay := prometheus.NewHistogram(metrics.HistogramOpts("relay_commit_to_published_seconds",
			"time from an event's outbox row written to its row marked published", metrics.LatencyBuckets))
		reg.MustRegister(publish, delay)
		relay, err := outbox.NewRelay(pool, js, logger.With("component", "relay"), outbox.Config{
			StreamReplicas: cfg.replicas, MaxPartitions: cfg.relayPartitions, Workers: cfg.relayWorkers,
			Retention: cfg.relayRetention, BatchSize: cfg.relayBatch, MinAtomicBatch: cfg.relayMinAtomic, PollInterval: cfg.relayPoll,
			PublishSeconds: publish, CommitToPublishedSeconds: delay,
		})
		if err != nil {
			return err
		}
		sum := func(f func(outbox.Stats) int64) func() int64 {
			return func() int64 { return f(relay.Stats()) }
		}
		ms = append(ms,
			counter("relay_published_total", "outbox events published by this process's relay", sum(func(s outbox.Stats) int64 { return s.Published })),
			counter("relay_duplicates_total", "publishes the stream dropped as duplicates (republished after a crash)", sum(func(s outbox.Stats) int64 { return s.Duplicates })),
			counter("relay_atomic_batches_total", "batches the stream stored as one atomic batch", sum(func(s outbox.Stats) int64 { return s.AtomicBatches })),
			counter("relay_atomic_fallbacks_total", "atomic batches the stream refused and the relay sent message by message (after a crash: a republished event inside; else see the relay's warnings)", sum(func(s outbox.Stats) int64 { return s.Fallbacks })),
			counter("relay_pruned_total", "published outbox rows pruned after the retention", sum(func(s outbox.Stats) int64 { return s.Pruned })),
			metrics.Metric{Name: "relay_partitions_owned", Help: "outbox partitions this process's relay publishes",
				Read: metrics.One(sum(func(s outbox.Stats) int64 { return s.Partitions }))})
		// A partition this relay does not own is another relay's, which only
		// the NOTIFY wakes before its poll (a second api: up to a second
		// later). While it owns all of them (one api), no NOTIFY is sent.
		wakeRelay = func() {
			relay.Wake()
			if !relay.OwnsAll() {
				notifier.Notify()
			}
		}
		wg.Go(func() { relay.Run(bgCtx) })
	} else {
		wakeRelay = notifier.Notify
	}

	// Read-your-writes: the projector NOTIFYs (after its batches commit,
	// coalesced) which orders it applied; waiting readers also poll.
	changes := query.NewChanges()
	wg.Go(func() { postgres.Listen(bgCtx, pool, "projection_applied", logger, changes.Notify) })

	// /readyz answers from the monitor's last round, never from a query of its own.
	// NATS is advisory: the api serves without it (the outbox keeps the
	// events until the relay can publish them again).
	monitor, err := health.NewMonitor(map[string]health.Check{
		"postgres": writablePool(pool),
		"nats":     NATSReady(nc),
	}, logger.With("component", "health"), health.Config{Interval: cfg.healthInterval, Advisory: []string{"nats"}})
	if err != nil {
		return err
	}
	wg.Go(func() { monitor.Run(bgCtx) })

	inFlight := httpapi.NewInFlightLimit(cfg.maxInFlight)
	tenants, err := httpapi.NewTenantLimits(cfg.tenantLimits)
	if err != nil {
		return err
	}
	clients, err := auth.New(pool, auth.Config{CacheTTL: cfg.tokenCacheTTL, AcceptLegacy: cfg.acceptLegacyTokens, Logger: logger.With("component", "auth")})
	if err != nil {
		return err
	}
	defer clients.Close() // its background re-reads, before the pool closes
	ms = append(ms,
		counter("http_requests_shed_total", "requests answered 429 because the api was serving its -max-in-flight limit", inFlight.Shed),
		metrics.Metric{Name: "http_requests_in_flight", Help: "/v1 requests being served now", Read: metrics.One(inFlight.InFlight)},
		counter("http_tenant_rate_limited_total", "requests answered 429 tenant-rate-limited (a tenant past -tenant-rate)", func() int64 { return tenants.Stats().RateLimited }),
		counter("http_tenant_overloaded_total", "requests answered 429 tenant-overloaded (a tenant at -tenant-max-in-flight or -tenant-max-waiting)", func() int64 { return tenants.Stats().Overloaded }),
		metrics.Metric{Name: "http_tenants_tracked", Help: "tenants whose limits this process keeps in memory", Read: metrics.One(func() int64 { return int64(tenants.Stats().Tenants) })},
		counter("auth_token_lookups_total", "bearer tokens looked up in the database (not cached)", func() int64 { return clients.Stats().Lookups }),
		counter("auth_negative_cache_hits_total", "unknown bearer tokens refused from the negative cache", func() int64 { return clients.Stats().NegativeHits }),
		counter("auth_busy_total", "bearer tokens answered 503 auth-busy (every look-up slot busy)", func() int64 { return clients.Stats().Busy }),
		counter("auth_stale_hits_total", "known bearer tokens served from the cache past -token-cache-ttl while being re-read", func() int64 { return clients.Stats().StaleHits }))
	requests, err := httpapi.NewRequestMetrics(reg)
	if err != nil {
		return err
	}
	if err := metrics.Register(reg, append(ms, backlogMetrics(ctx, pool)...)...); err != nil {
		return err
	}
	handler := httpapi.New(httpapi.Deps{
		Logger:             logger,
		Auth:               clients,
		Idempotency:        idem,
		Keys:               idem,
		CreateOrder:        command.NewCreateOrderHandler(),
		PayOrder:           command.NewPayOrderHandler(),
		ShipOrder:          command.NewShipOrderHandler(),
		CancelOrder:        command.NewCancelOrderHandler(),
		RefundOrder:        command.NewRefundOrderHandler(),
		UpdateOrder:        command.NewUpdateOrderHandler(),
		GetOrder:           query.NewGetOrderHandler(shares, changes),
		ListOrders:         query.NewListOrdersHandler(shares),
		GetCustomerSummary: query.NewGetCustomerSummaryHandler(shares, changes),
		GetDailySales:      query.NewGetDailySalesHandler(shares),
		KeyWait:            cfg.keyWait,
		Health:             monitor,
		Metrics:            metrics.Handler(reg),
		Requests:           requests,
		InFlight:           inFlight,
		Tenants:            tenants,
		BodyTimeout:        cfg.bodyTimeout,
		RequestTimeout:     requestTimeout(cfg.keyWait, cfg.bodyTimeout),
	})
	// Serve returns once in-flight requests are done; the deferred stop of
	// the background work and the connections runs after that.
	return ServeConns(ctx, cfg.httpAddr, handler, logger, APIShutdownTimeout, cfg.maxConns, reg)
}

// requestTimeout is a /v1 request's deadline after its body is in
// (httpapi.Deps.RequestTimeout) with key waits of keyWait and bodies of up
// to bodyTimeout: room for three key waits (a command) or a read-your-writes
// wait (a read),
// ending 5 s before the server's write timeout even after the slowest
// body, past which an answer is never delivered (a request timed out by
// the database's own 60 s statement_timeout used to end there, its 500
// lost). parseAPIConfig refuses settings that leave less than the waits.
func requestTimeout(keyWait, bodyTimeout time.Duration) time.Duration {
	return min(max(httpapi.DefaultRequestTimeout, legitimateWaits(keyWait)), serverWriteTimeout-5*time.Second-bodyTimeout)
}

// legitimateWaits is the longest a request may wait on purpose after its
// body: three key waits (a command), or a read-your-writes wait (a read).
func legitimateWaits(keyWait time.Duration) time.Duration {
	return max(3*keyWait, httpapi.MaxReadWait)
}

// writablePool checks that the database takes writes: a hot standby (a
// failover whose address still names the demoted primary) or a database
// set read-only answers a ping, and refuses every command.
func writablePool(pool *pgxpool.Pool) health.Check {
	return func(ctx context.Context) error {
		var readOnly bool
		if err := pool.QueryRow(ctx, `SELECT pg_is_in_recovery() OR current_setting('transaction_read_only')::bool`).Scan(&readOnly); err != nil {
			return err
		}
		if readOnly {
			return errors.New("the database is read-only (a standby, or default_transaction_read_only)")
		}
		return nil
	}
}

// backlogMetrics report what waits in the outbox (for every relay): one
// statement per scrape, on the partial index of unpublished rows, whose
// reading both gauges share.
func backlogMetrics(ctx context.Context, pool *pgxpool.Pool) []metrics.Metric {
	var (
		mu   sync.Mutex
		at   time.Time
		last outbox.Backlog
		err  error
	)
	read := func(f func(outbox.Backlog) float64) func() []metrics.Sample {
		return func() []metrics.Sample {
			mu.Lock()
			defer mu.Unlock()
			if time.Since(at) > 100*time.Millisecond { // not this scrape's reading
				bctx, cancel := context.WithTimeout(ctx, 2*time.Second)
				last, err = outbox.ReadBacklog(bctx, pool)
				cancel()
				at = time.Now()
			}
			if err != nil {
				return nil
			}
			return []metrics.Sample{{Value: f(last)}}
		}
	}
	return []metrics.Metric{
		{Name: "outbox_backlog_events", Help: "outbox events not yet published", Read: read(func(b outbox.Backlog) float64 { return float64(b.Rows) })},
		{Name: "outbox_oldest_unpublished_seconds", Help: "age of the oldest unpublished outbox event", Read: read(func(b outbox.Backlog) float64 { return b.OldestAge.Seconds() })},
	}
}

// createGroupSlots is the group commit's slots for -create-group-slots
// flag (-1: the default) on a pool of poolMax connections, whatever set its
// size: batches of creates hold at most half the pool.
func createGroupSlots(flag, poolMax int) (int, error) {
	if flag == -1 {
		return min(DefaultCreateGroupSlots, poolMax/2), nil
	}
	if flag > poolMax/2 {
		return 0, fmt.Errorf("-create-group-slots must be 0 to half of the pool's %d connections (%d), got %d", poolMax, poolMax/2, flag)
	}
	return flag, nil
}
