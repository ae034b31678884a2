// Package agent is meridian-dp (docs/dataplane.md#joining): the agent a
// workload runs beside it. It joins the zone with a Dataplane token,
// registers the workload's Dataplane, makes the workload's keys (they never
// leave the machine) and has their certificates signed, writes the gRPC
// xDS bootstrap, runs the workload with it, renews the certificates at two
// thirds of their life, and rejoins a zone that restarted.
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

// Agent holds a joined Dataplane.
type Agent struct {
	cfg    Config
	conn   *grpc.ClientConn
	client dataplanev1.AgentServiceClient
	target string

	mu     sync.Mutex
	joined *dataplanev1.Joined
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
	tlsCfg := &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
	conn, err := grpc.NewClient(host, grpc.WithTransportCredentials(credentials.NewTLS(tlsCfg)),
		grpc.WithPerRPCCredentials(bearer(strings.TrimSpace(cfg.Token))))
	if err != nil {
		return nil, &Error{What: "connect to the zone", Where: host, Err: err}
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, &Error{What: "--dir", Where: cfg.Dir, Err: err}
	}
	if err := os.Chmod(cfg.Dir, 0o700); err != nil {
		return nil, &Error{What: "--dir", Where: cfg.Dir, Err: err}
	}
	return &Agent{cfg: cfg, conn: conn, client: dataplanev1.NewAgentServiceClient(conn), target: host}, nil
}

// Close releases the connection.
func (a *Agent) Close() error { return a.conn.Close() }

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
	stream, err := a.client.Join(ctx, &dataplanev1.JoinRequest{Dataplane: a.cfg.Dataplane, Version: a.cfg.Version})
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
	if err := a.writeBootstrap(j); err != nil {
		sess.cancel()
		return nil, err
	}
	return &Joined{agent: a, sess: sess, info: j}, nil
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
// rejoins when the session breaks (a zone that restarted).
func (j *Joined) Hold(ctx context.Context) {
	a := j.agent
	sess := j.sess
	renewAt := a.nextRenewal()
	events := make(chan *dataplanev1.JoinResponse)
	broken := make(chan error, 1)
	recv := func(s *session) {
		for {
			ev, err := s.stream.Recv()
			if err != nil {
				broken <- err
				return
			}
			select {
			case events <- ev:
			case <-ctx.Done():
				return
			}
		}
	}
	go recv(sess)
	defer func() { sess.cancel() }()
	backoff := 100 * time.Millisecond
	for {
		timer := time.NewTimer(time.Until(renewAt))
		select {
		case <-ctx.Done():
			timer.Stop()
			return
		case <-timer.C:
		case ev := <-events:
			timer.Stop()
			if ev.GetRenew() == nil {
				continue
			}
			a.cfg.Logger.Info("the zone asked for new certificates", "mtls", ev.GetRenew().GetMtls())
			a.mu.Lock()
			a.joined.Mtls = ev.GetRenew().GetMtls()
			a.mu.Unlock()
		case err := <-broken:
			timer.Stop()
			sess.cancel()
			a.cfg.Logger.Warn("session with the zone broke; rejoining", "error", err)
			for {
				s, jn, err := a.join(ctx)
				if err == nil {
					sess, backoff = s, 100*time.Millisecond
					a.mu.Lock()
					a.joined = jn
					a.mu.Unlock()
					go recv(sess)
					a.cfg.Logger.Info("rejoined the zone", "node", jn.GetNodeId())
					break
				}
				a.cfg.Logger.Warn("rejoining the zone failed", "error", err, "retry_in", backoff)
				select {
				case <-ctx.Done():
					return
				case <-time.After(backoff):
				}
				backoff = min(2*backoff, 5*time.Second)
			}
		}
		a.mu.Lock()
		jn := a.joined
		a.mu.Unlock()
		if next, err := a.renew(ctx, jn); err != nil {
			a.cfg.Logger.Warn("renewing certificates failed; retrying", "error", err)
			renewAt = time.Now().Add(time.Second)
		} else {
			renewAt = next
		}
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
	resp, err := a.client.Sign(ctx, &dataplanev1.SignRequest{Kind: kind, Csr: csr, NodeId: node})
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
// zone's xDS server over TLS with the xDS client certificate, the node,
// the workload certificate's provider, the server listener template.
func (a *Agent) writeBootstrap(j *dataplanev1.Joined) error {
	dir := a.cfg.Dir
	file := func(d, name string) string { return filepath.Join(dir, d, name) }
	b := map[string]any{
		"xds_servers": []any{map[string]any{
			"server_uri": a.target,
			"channel_creds": []any{map[string]any{"type": "tls", "config": map[string]any{
				"ca_certificate_file": file(XDSDir, "ca.pem"),
				"certificate_file":    file(XDSDir, "cert.pem"),
				"private_key_file":    file(XDSDir, "key.pem"),
				"refresh_interval":    "10s",
			}}},
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
