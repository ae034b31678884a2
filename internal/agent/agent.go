// Package agent is meridian-dp (docs/dataplane.md#joining): the agent a
// workload runs beside it. It joins the zone with a Dataplane token,
// registers the workload's Dataplane, makes the workload's keys (they never
// leave the machine) and has their certificates signed, relays the
// workload's xDS streams over its own connection (relay.go), writes the
// gRPC xDS bootstrap, runs the workload with it, renews the certificates
// at two thirds of their life, and rejoins a zone that restarted.
package agent

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/meridian-mesh/meridian/internal/ca"
	"github.com/meridian-mesh/meridian/internal/xds"
	dataplanev1 "github.com/meridian-mesh/meridian/proto/meridian/dataplane/v1"
)

// Config is one agent.
type Config struct {
	// CPAddress is the zone's xDS address, https://HOST:PORT.
	CPAddress string
	// Dataplane is the Dataplane file's content; Token the Dataplane token.
	Dataplane []byte
	Token     string
	// CACert verifies the zone (PEM); nil: the system's roots.
	CACert []byte
	// Dir receives the bootstrap and the certificates (0700, files 0600).
	Dir     string
	Version string
	Logger  hclog.Logger
}

// Agent holds a joined Dataplane. It keeps one connection to the zone:
// its own calls and, relayed (relay.go), its workload's xDS streams. The
// connection presents the xDS client certificate this agent had signed,
// which identifies the relayed streams; the first join, before there is
// one, is made on a connection without it, replaced once it is signed.
type Agent struct {
	cfg    Config
	tls    *tls.Config
	target string

	mu     sync.Mutex
	conn   *grpc.ClientConn
	client dataplanev1.AgentServiceClient
	// xdsCert is the xDS client certificate this agent had signed (nil
	// before the first); withCert says conn was made to present it.
	xdsCert  *tls.Certificate
	withCert bool
	joined   *dataplanev1.Joined
	// renewed run after each renewal (the SDS server's update).
	renewed []func()
}

// Paths of the files the agent writes under Dir.
const (
	BootstrapFile = "bootstrap.json"
	CertsDir      = "certs"
	XDSDir        = "xds"
)

// Error is a failure to join, one line saying what and where.
type Error struct {
	What  string
	Where string
	Err   error
}

func (e *Error) Error() string {
	if e.Where == "" {
		return e.What + ": " + e.Err.Error()
	}
	return e.What + " (" + e.Where + "): " + e.Err.Error()
}

func (e *Error) Unwrap() error { return e.Err }

// New checks cfg and prepares the connection (nothing is sent yet).
func New(cfg Config) (*Agent, error) {
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	u, err := url.Parse(cfg.CPAddress)
	if err != nil || u.Scheme != "https" || u.Host == "" {
		return nil, &Error{What: "--cp-address", Where: cfg.CPAddress, Err: errors.New("want https://HOST:PORT, the zone's xDS address")}
	}
	host := u.Host
	if _, _, err := net.SplitHostPort(host); err != nil {
		host = net.JoinHostPort(host, "5678")
	}
	if strings.TrimSpace(cfg.Token) == "" {
		return nil, &Error{What: "dataplane token", Err: errors.New("the token file is empty")}
	}
	roots, err := x509.SystemCertPool()
	if err != nil || cfg.CACert != nil {
		roots = x509.NewCertPool()
	}
	if cfg.CACert != nil && !roots.AppendCertsFromPEM(cfg.CACert) {
		return nil, &Error{What: "--ca-cert-file", Err: errors.New("holds no PEM certificate")}
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, &Error{What: "--dir", Where: cfg.Dir, Err: err}
	}
	if err := os.Chmod(cfg.Dir, 0o700); err != nil {
		return nil, &Error{What: "--dir", Where: cfg.Dir, Err: err}
	}
	a := &Agent{cfg: cfg, target: host}
	a.tls = &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12, GetClientCertificate: a.clientCertificate}
	if err := a.dial(); err != nil {
		return nil, err
	}
	return a, nil
}

// clientCertificate is the xDS client certificate this agent had signed,
// none before the first.
func (a *Agent) clientCertificate(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.xdsCert == nil {
		return &tls.Certificate{}, nil
	}
	return a.xdsCert, nil
}

// dial replaces the connection to the zone (the old one is closed): it
// presents the xDS client certificate when there is one.
func (a *Agent) dial() error {
	conn, err := grpc.NewClient(a.target, grpc.WithTransportCredentials(credentials.NewTLS(a.tls)),
		grpc.WithPerRPCCredentials(bearer(strings.TrimSpace(a.cfg.Token))))
	if err != nil {
		return &Error{What: "connect to the zone", Where: a.target, Err: err}
	}
	a.mu.Lock()
	old := a.conn
	a.conn, a.client, a.withCert = conn, dataplanev1.NewAgentServiceClient(conn), a.xdsCert != nil
	a.mu.Unlock()
	if old != nil {
		_ = old.Close()
	}
	return nil
}

// current is the connection and its agent client.
func (a *Agent) current() (*grpc.ClientConn, dataplanev1.AgentServiceClient) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.conn, a.client
}

// Close releases the connection.
func (a *Agent) Close() error {
	conn, _ := a.current()
	return conn.Close()
}

// bearer sends the Dataplane token on every call (over TLS only).
type bearer string

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(b)}, nil
}
func (bearer) RequireTransportSecurity() bool { return true }

// session is one Join stream.
type session struct {
	stream grpc.ServerStreamingClient[dataplanev1.JoinResponse]
	cancel context.CancelFunc
}

// join registers the Dataplane; the returned session holds it.
func (a *Agent) join(ctx context.Context) (*session, *dataplanev1.Joined, error) {
	ctx, cancel := context.WithCancel(ctx)
	_, client := a.current()
	stream, err := client.Join(ctx, &dataplanev1.JoinRequest{Dataplane: a.cfg.Dataplane, Version: a.cfg.Version})
	if err == nil {
		var first *dataplanev1.JoinResponse
		if first, err = stream.Recv(); err == nil {
			if j := first.GetJoined(); j != nil {
				return &session{stream: stream, cancel: cancel}, j, nil
			}
			err = errors.New("the zone answered without registering the Dataplane")
		}
	}
	cancel()
	return nil, nil, a.explain(err)
}

// explain turns a call's error into one line saying what and where.
func (a *Agent) explain(err error) error {
	st, ok := status.FromError(err)
	if !ok {
		return &Error{What: "join the zone", Where: a.target, Err: err}
	}
	switch st.Code() {
	case codes.Unavailable:
		msg := st.Message()
		if strings.Contains(msg, "certificate") || strings.Contains(msg, "x509") || strings.Contains(msg, "tls") {
			return &Error{What: "the zone's certificate is not trusted (give its CA with --ca-cert-file)", Where: a.target, Err: errors.New(msg)}
		}
		return &Error{What: "the zone is unreachable", Where: a.target, Err: errors.New(msg)}
	case codes.Unauthenticated:
		return &Error{What: "the zone refused the Dataplane token", Where: a.target, Err: errors.New(st.Message())}
	case codes.PermissionDenied:
		return &Error{What: "the zone refused the Dataplane", Where: a.target, Err: errors.New(st.Message())}
	case codes.InvalidArgument:
		return &Error{What: "the Dataplane file is invalid", Where: a.target, Err: errors.New(st.Message())}
	}
	return &Error{What: "join the zone", Where: a.target, Err: errors.New(st.Message())}
}

// Join registers the Dataplane, fetches its certificates and writes the
// bootstrap. Hold the session with Run.
func (a *Agent) Join(ctx context.Context) (*Joined, error) {
	sess, j, err := a.join(ctx)
	if err != nil {
		return nil, err
	}
	a.mu.Lock()
	a.joined = j
	a.mu.Unlock()
	if _, err := a.renew(ctx, j); err != nil {
		sess.cancel()
		return nil, err
	}
	if sess, j, err = a.presentCertificate(ctx, sess, j); err != nil {
		return nil, err
	}
	if err := a.writeBootstrap(j); err != nil {
		sess.cancel()
		return nil, err
	}
	return &Joined{agent: a, sess: sess, info: j}, nil
}

// presentCertificate moves the session to a connection that presents the
// xDS client certificate, when the current one does not: the zone hands
// the Dataplane to the newer session and ends the first.
func (a *Agent) presentCertificate(ctx context.Context, sess *session, j *dataplanev1.Joined) (*session, *dataplanev1.Joined, error) {
	a.mu.Lock()
	done := a.withCert
	a.mu.Unlock()
	if done {
		return sess, j, nil
	}
	sess.cancel()
	if err := a.dial(); err != nil {
		return nil, nil, err
	}
	sess, j, err := a.join(ctx)
	if err != nil {
		return nil, nil, err
	}
	a.mu.Lock()
	a.joined = j
	a.mu.Unlock()
	return sess, j, nil
}

// Joined is a joined Dataplane.
type Joined struct {
	agent *Agent
	sess  *session
	info  *dataplanev1.Joined
}

// NodeID is the Dataplane's xDS node id; Zone the zone it joined.
func (j *Joined) NodeID() string { return j.info.GetNodeId() }
func (j *Joined) Zone() string   { return j.info.GetZone() }

// Bootstrap is the path of the gRPC xDS bootstrap.
func (j *Joined) Bootstrap() string { return filepath.Join(j.agent.cfg.Dir, BootstrapFile) }

// Hold keeps the Dataplane registered until ctx ends: it renews the
// certificates at two thirds of their life (or when the zone asks), and
// rejoins when the session breaks (a zone that restarted). A zone that no
// longer accepts the xDS client certificate (its data was replaced) is
// joined again without it, and a new one is signed.
func (j *Joined) Hold(ctx context.Context) {
	a := j.agent
	sess := j.sess
	renewAt := a.nextRenewal()
	type event struct {
		s   *session
		ev  *dataplanev1.JoinResponse
		err error
	}
	events := make(chan event)
	recv := func(s *session) {
		for {
			ev, err := s.stream.Recv()
			select {
			case events <- event{s, ev, err}:
			case <-ctx.Done():
				return
			}
			if err != nil {
				return
			}
		}
	}
	go recv(sess)
	defer func() {
		if sess != nil {
			sess.cancel()
		}
	}()
	for {
		timer := time.NewTimer(time.Until(renewAt))
		select {
		case <-ctx.Done():
			timer.Stop()
			return
		case <-timer.C:
		case e := <-events:
			timer.Stop()
			if e.s != sess {
				continue // a session this agent replaced
			}
			if e.err != nil {
				sess.cancel()
				a.cfg.Logger.Warn("session with the zone broke; rejoining", "error", e.err)
				if sess = a.rejoin(ctx); sess == nil {
					return
				}
				go recv(sess)
				break
			}
			if e.ev.GetRenew() == nil {
				continue
			}
			a.cfg.Logger.Info("the zone asked for new certificates", "mtls", e.ev.GetRenew().GetMtls())
			a.mu.Lock()
			a.joined.Mtls = e.ev.GetRenew().GetMtls()
			a.mu.Unlock()
		}
		a.mu.Lock()
		jn := a.joined
		a.mu.Unlock()
		next, err := a.renew(ctx, jn)
		if err != nil {
			a.cfg.Logger.Warn("renewing certificates failed; retrying", "error", err)
			renewAt = time.Now().Add(time.Second)
			continue
		}
		renewAt = next
		if s, jn, err := a.presentCertificate(ctx, sess, jn); err != nil {
			a.cfg.Logger.Warn("moving to a connection with the new xDS certificate failed", "error", err)
		} else if s != sess {
			sess = s
			a.mu.Lock()
			a.joined = jn
			a.mu.Unlock()
			go recv(sess)
		}
	}
}

// rejoin joins again until it succeeds or ctx ends (nil). After a few
// failures on a connection presenting the xDS client certificate, it
// tries one without: a zone whose data was replaced no longer knows the
// certificate's CA and refuses the handshake.
func (a *Agent) rejoin(ctx context.Context) *session {
	backoff := 100 * time.Millisecond
	for failures := 1; ; failures++ {
		s, jn, err := a.join(ctx)
		if err == nil {
			a.mu.Lock()
			a.joined = jn
			a.mu.Unlock()
			a.cfg.Logger.Info("rejoined the zone", "node", jn.GetNodeId())
			return s
		}
		a.cfg.Logger.Warn("rejoining the zone failed", "error", err, "retry_in", backoff)
		if failures%3 == 0 {
			a.mu.Lock()
			withCert := a.withCert
			a.xdsCert = nil
			a.mu.Unlock()
			if withCert {
				if err := a.dial(); err != nil {
					a.cfg.Logger.Warn("reconnecting without the xDS certificate failed", "error", err)
				}
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

// nextRenewal is when the soonest certificate reaches two thirds of its life.
func (a *Agent) nextRenewal() time.Time {
	soon := time.Now().Add(time.Hour)
	for _, dir := range []string{XDSDir, CertsDir} {
		certs, err := ca.ParseCerts(readOrNil(filepath.Join(a.cfg.Dir, dir, "cert.pem")))
		if err != nil {
			continue
		}
		life := certs[0].NotAfter.Sub(certs[0].NotBefore)
		at := certs[0].NotBefore.Add(2 * life / 3)
		if at.Before(soon) {
			soon = at
		}
	}
	return soon
}

func readOrNil(path string) []byte {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	return b
}

// renew makes fresh keys and has their certificates signed: the xDS client
// certificate always, the workload certificate when the mesh has mTLS
// (without it the xDS certificate stands in, so the bootstrap's provider
// has files; no mesh traffic uses TLS then). It returns when to renew next.
func (a *Agent) renew(ctx context.Context, j *dataplanev1.Joined) (time.Time, error) {
	xdsFiles, err := a.sign(ctx, j.GetNodeId(), dataplanev1.CertificateKind_CERTIFICATE_KIND_XDS)
	if err != nil {
		return time.Time{}, err
	}
	if err := writeFiles(filepath.Join(a.cfg.Dir, XDSDir), xdsFiles); err != nil {
		return time.Time{}, err
	}
	pair, err := tls.X509KeyPair(xdsFiles.cert, xdsFiles.key)
	if err != nil {
		return time.Time{}, fmt.Errorf("the zone signed an unreadable xDS certificate: %w", err)
	}
	a.mu.Lock()
	a.xdsCert = &pair
	a.mu.Unlock()
	workload := xdsFiles
	if j.GetMtls() {
		if workload, err = a.sign(ctx, j.GetNodeId(), dataplanev1.CertificateKind_CERTIFICATE_KIND_WORKLOAD); err != nil {
			return time.Time{}, err
		}
	}
	if err := writeFiles(filepath.Join(a.cfg.Dir, CertsDir), workload); err != nil {
		return time.Time{}, err
	}
	a.mu.Lock()
	hooks := slices.Clone(a.renewed)
	a.mu.Unlock()
	for _, fn := range hooks {
		fn()
	}
	return a.nextRenewal(), nil
}

// certFiles are a key and its certificate, with the trust bundle.
type certFiles struct {
	cert, key, ca []byte
}

func (a *Agent) sign(ctx context.Context, node string, kind dataplanev1.CertificateKind) (certFiles, error) {
	key, err := ca.NewKey(rand.Reader)
	if err != nil {
		return certFiles{}, err
	}
	csr, err := ca.NewCSR(rand.Reader, key, node)
	if err != nil {
		return certFiles{}, err
	}
	_, client := a.current()
	resp, err := client.Sign(ctx, &dataplanev1.SignRequest{Kind: kind, Csr: csr, NodeId: node})
	if err != nil {
		return certFiles{}, a.explain(err)
	}
	keyPEM, err := ca.EncodeKey(key)
	if err != nil {
		return certFiles{}, err
	}
	return certFiles{cert: resp.GetCertificateChain(), key: keyPEM, ca: resp.GetTrustBundle()}, nil
}

// writeFiles replaces dir's cert.pem, key.pem and ca.pem, each atomically
// (the workload's file watcher reads whole files only).
func writeFiles(dir string, f certFiles) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	for name, data := range map[string][]byte{"key.pem": f.key, "cert.pem": f.cert, "ca.pem": f.ca} {
		if err := writeAtomic(filepath.Join(dir, name), data); err != nil {
			return err
		}
	}
	return nil
}

func writeAtomic(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(0o600); err != nil {
		_ = tmp.Close()
		return err
	}
	if _, err := tmp.Write(data); err != nil {
		_ = tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// writeBootstrap writes the gRPC xDS bootstrap (gRFC A27, A29, A65): the
// agent's xDS relay (to the zone over the agent's connection), the node,
// the workload certificate's provider, the server listener template.
func (a *Agent) writeBootstrap(j *dataplanev1.Joined) error {
	dir := a.cfg.Dir
	file := func(d, name string) string { return filepath.Join(dir, d, name) }
	b := map[string]any{
		"xds_servers": []any{map[string]any{
			// The agent's relay (relay.go): a unix socket only this
			// user can open, so no transport security of its own.
			"server_uri":      "unix://" + a.relayPath(),
			"channel_creds":   []any{map[string]any{"type": "insecure"}},
			"server_features": []any{"xds_v3"},
		}},
		"node": map[string]any{
			"id":       j.GetNodeId(),
			"cluster":  j.GetMesh(),
			"locality": map[string]any{"zone": j.GetZone()},
			"metadata": map[string]any{"meridian.io/dataplane": j.GetName(), "meridian.io/namespace": j.GetNamespace()},
		},
		"certificate_providers": map[string]any{xds.CertProvider: map[string]any{
			"plugin_name": "file_watcher",
			"config": map[string]any{
				"certificate_file":    file(CertsDir, "cert.pem"),
				"private_key_file":    file(CertsDir, "key.pem"),
				"ca_certificate_file": file(CertsDir, "ca.pem"),
				"refresh_interval":    "1s",
			},
		}},
		"server_listener_resource_name_template": xds.ServerListenerTemplate,
	}
	raw, err := json.MarshalIndent(b, "", "  ")
	if err != nil {
		return err
	}
	return writeAtomic(filepath.Join(dir, BootstrapFile), raw)
}

// Logf writes to w as the agent's one-line errors do.
func Logf(w io.Writer, format string, args ...any) {
	fmt.Fprintf(w, "meridian-dp: "+format+"\n", args...)
}
