package node

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/tidemq/tidemq/core"
	"github.com/tidemq/tidemq/gateway"
	"github.com/tidemq/tidemq/internal/cluster"
)

// Span pipelines (Config.SpanPipeline).
const (
	// SpanPipelineLean exports spans through internal/otlpspans: each span
	// encoded to OTLP protobuf when it ends, sent over OTLP/HTTP.
	SpanPipelineLean = "lean"
	// SpanPipelineSDK exports spans through the stock OpenTelemetry SDK: a
	// batch span processor and otlptracehttp (or otlptracegrpc).
	SpanPipelineSDK = "sdk"
)

// Config is what a broker node is started with: the binary's settings.
type Config struct {
	Addr       string // listen address; port 0 picks a free one
	Data       string // data directory, created if missing
	AutoCreate bool   // create missing topics on send and subscriptions on pull
	Fsync      string // "always": a send is answered after its batch is fsynced; "never"

	// The store's performance switches, each on by default; off is the
	// plain way (for A/B measurement, or where it does not pay).
	SyncSpin  bool // poll for an fsync's completion while the CPU is idle
	FsyncRing bool // fsync the WAL through io_uring
	WALSpares bool // keep pre-allocated WAL files for rotation

	SpanPipeline string // SpanPipelineLean or SpanPipelineSDK

	Tokens          string // tokens file, YAML or JSON; "" serves without authentication
	Insecure        bool   // allow listening beyond loopback without Tokens
	MaxMessageBytes int
	MaxConnections  int   // client connections served at once; more wait in the backlog
	BodyBudgetBytes int64 // request-body bytes held by requests in flight; past it they get 429 unread
	MinFreeBytes    int64
	ConsumerExpiry  time.Duration
	ShutdownTimeout time.Duration // how long the binary's SIGTERM waits for in-flight requests
	JaegerUI        string        // Jaeger UI base URL for trace links in the console
	// Region names this broker's region (SPEC §8): GET /healthz answers it
	// and mirrors record it in each copy's path ("" is "local").
	Region string
	// DedupWindow is how long a send's dedup key is remembered (tests
	// shorten it; 0 is 5 minutes).
	DedupWindow time.Duration

	// Cluster (SPEC §7.1): a node with NodeID is a member of a raft group;
	// without it, a single node as before.
	NodeID           string
	ClusterAddr      string // listen address for node-to-node traffic
	ClusterAdvertise string // what the other nodes dial (default ClusterAddr)
	AdvertiseAddr    string // the HTTP address other nodes forward to (default Addr)
	Peers            string // id=host:port,…: a new cluster's first members
	ClusterSecret    string // shared secret file
	ClusterTLSCert   string // mutual TLS: certificate, key and CA files
	ClusterTLSKey    string
	ClusterTLSCA     string
	// Raft's timing and log size (TIDEMQ_RAFT_*; tests shrink them).
	RaftHeartbeat         time.Duration
	RaftSnapshotThreshold uint64
	RaftTrailingLogs      uint64
	RaftSnapshotInterval  time.Duration

	// Getenv reads the OTEL_* variables of the telemetry (exporter
	// endpoint, protocol, sampler, batching, service name); nil is
	// os.Getenv.
	Getenv func(string) string
}

// Defaults is the binary's configuration when nothing is set.
func Defaults() Config {
	return Config{
		Addr: "127.0.0.1:8080", Data: "./data", AutoCreate: true, Fsync: "always",
		SyncSpin: true, FsyncRing: true, WALSpares: true, SpanPipeline: SpanPipelineLean,
		MaxMessageBytes: core.DefaultMaxMessageBytes, MaxConnections: 10000, MinFreeBytes: 128 << 20,
		BodyBudgetBytes: gateway.DefaultBodyBudgetBytes, ConsumerExpiry: 2 * time.Minute, ShutdownTimeout: 30 * time.Second,
		Region: gateway.DefaultRegion, DedupWindow: core.DedupWindow,
	}
}

// FromEnv is Defaults overridden by the TIDEMQ_* variables getenv reads.
// cmd/tidemq uses them as its flags' defaults; the load tester's
// in-process broker reads them the same way.
func FromEnv(getenv func(string) string) (Config, error) {
	c := Defaults()
	str := func(name string, dst *string) {
		if v := getenv(name); v != "" {
			*dst = v
		}
	}
	var errs []error
	boolean := func(name string, dst *bool) {
		if v := getenv(name); v != "" {
			b, err := strconv.ParseBool(v)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", name, err))
				return
			}
			*dst = b
		}
	}
	str("TIDEMQ_ADDR", &c.Addr)
	str("TIDEMQ_DATA", &c.Data)
	boolean("TIDEMQ_AUTO_CREATE", &c.AutoCreate)
	str("TIDEMQ_FSYNC", &c.Fsync)
	boolean("TIDEMQ_SYNC_SPIN", &c.SyncSpin)
	boolean("TIDEMQ_FSYNC_RING", &c.FsyncRing)
	boolean("TIDEMQ_WAL_SPARES", &c.WALSpares)
	str("TIDEMQ_SPAN_PIPELINE", &c.SpanPipeline)
	str("TIDEMQ_TOKENS", &c.Tokens)
	c.Insecure = getenv("TIDEMQ_INSECURE") == "true"
	if v := getenv("TIDEMQ_MAX_MESSAGE_BYTES"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			errs = append(errs, fmt.Errorf("TIDEMQ_MAX_MESSAGE_BYTES: %w", err))
		} else {
			c.MaxMessageBytes = n
		}
	}
	if v := getenv("TIDEMQ_BODY_BUDGET_BYTES"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			errs = append(errs, fmt.Errorf("TIDEMQ_BODY_BUDGET_BYTES: %w", err))
		} else {
			c.BodyBudgetBytes = n
		}
	}
	str("TIDEMQ_JAEGER_UI", &c.JaegerUI)
	str("TIDEMQ_REGION", &c.Region)
	str("TIDEMQ_NODE_ID", &c.NodeID)
	str("TIDEMQ_CLUSTER_ADDR", &c.ClusterAddr)
	str("TIDEMQ_CLUSTER_ADVERTISE", &c.ClusterAdvertise)
	str("TIDEMQ_ADVERTISE_ADDR", &c.AdvertiseAddr)
	str("TIDEMQ_PEERS", &c.Peers)
	str("TIDEMQ_CLUSTER_SECRET", &c.ClusterSecret)
	str("TIDEMQ_CLUSTER_TLS_CERT", &c.ClusterTLSCert)
	str("TIDEMQ_CLUSTER_TLS_KEY", &c.ClusterTLSKey)
	str("TIDEMQ_CLUSTER_TLS_CA", &c.ClusterTLSCA)
	for name, dst := range map[string]*time.Duration{"TIDEMQ_DEDUP_WINDOW": &c.DedupWindow, "TIDEMQ_RAFT_HEARTBEAT": &c.RaftHeartbeat, "TIDEMQ_RAFT_SNAPSHOT_INTERVAL": &c.RaftSnapshotInterval} {
		if v := getenv(name); v != "" {
			d, err := time.ParseDuration(v)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", name, err))
			}
			*dst = d
		}
	}
	for name, dst := range map[string]*uint64{"TIDEMQ_RAFT_SNAPSHOT_THRESHOLD": &c.RaftSnapshotThreshold, "TIDEMQ_RAFT_TRAILING_LOGS": &c.RaftTrailingLogs} {
		if v := getenv(name); v != "" {
			n, err := strconv.ParseUint(v, 10, 64)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", name, err))
			}
			*dst = n
		}
	}
	return c, errors.Join(errs...)
}

// Check reports every setting that cannot run, at once.
func (c Config) Check() error {
	var problems []error
	if c.Fsync != "always" && c.Fsync != "never" {
		problems = append(problems, fmt.Errorf("--fsync must be always or never, not %q", c.Fsync))
	}
	if c.SpanPipeline != SpanPipelineLean && c.SpanPipeline != SpanPipelineSDK {
		problems = append(problems, fmt.Errorf("--span-pipeline must be %s or %s, not %q", SpanPipelineLean, SpanPipelineSDK, c.SpanPipeline))
	}
	if c.MaxMessageBytes < 1 || c.MaxMessageBytes > gateway.DefaultMaxRequestBytes {
		problems = append(problems, fmt.Errorf("--max-message-bytes must be between 1 and %d", gateway.DefaultMaxRequestBytes))
	}
	if c.BodyBudgetBytes < 1 {
		problems = append(problems, fmt.Errorf("--body-budget-bytes must be at least 1, not %d", c.BodyBudgetBytes))
	}
	if !c.Insecure && c.Tokens == "" && !Loopback(c.Addr) {
		problems = append(problems, fmt.Errorf("--addr %s listens beyond loopback without --tokens: anyone who can reach it could use the broker; give --insecure to do it anyway", c.Addr))
	}
	if err := core.ValidateName("region", c.Region); c.Region != "" && (err != nil || len(c.Region) > 64) {
		problems = append(problems, fmt.Errorf("--region must be 1-64 characters matching ^[A-Za-z0-9][A-Za-z0-9._-]*$, not %q", c.Region))
	}
	if c.DedupWindow < 0 {
		problems = append(problems, fmt.Errorf("--dedup-window must not be negative, not %s", c.DedupWindow))
	}
	if c.NodeID == "" && (c.Peers != "" || c.ClusterAddr != "") {
		problems = append(problems, errors.New("--peers and --cluster-addr need --node-id"))
	}
	if c.NodeID != "" && c.ClusterAddr == "" {
		problems = append(problems, errors.New("--node-id needs --cluster-addr (the address for node-to-node traffic)"))
	}
	if c.NodeID != "" {
		if _, err := cluster.ParsePeers(c.Peers); err != nil {
			problems = append(problems, err)
		}
		if err := c.clusterSecurity().Check(c.ClusterAddr, c.ClusterAdvertise); err != nil {
			problems = append(problems, err)
		}
	}
	return errors.Join(problems...)
}

// Clustered reports whether the node is a member of a cluster.
func (c Config) Clustered() bool { return c.NodeID != "" }

func (c Config) clusterSecurity() cluster.Security {
	return cluster.Security{CertFile: c.ClusterTLSCert, KeyFile: c.ClusterTLSKey, CAFile: c.ClusterTLSCA,
		SecretFile: c.ClusterSecret, Insecure: c.Insecure}
}

// Loopback reports whether addr listens on loopback only.
func Loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
