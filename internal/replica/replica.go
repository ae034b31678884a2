// Package replica links one global control plane replica to the etcd
// cluster that N replicas share: the store, the replica's health (a replica
// without a quorum stops serving), the leader election that runs what must
// run once (tombstone expiry), the key material every replica holds alike
// (kept in etcd encrypted with the secrets key) and the zone statuses each
// replica publishes for the others. See docs/operations.md#high-availability.
package replica

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"

	"github.com/meridian-mesh/meridian/internal/auth"
	"github.com/meridian-mesh/meridian/internal/storage/etcdstore"
	"github.com/meridian-mesh/meridian/internal/storage/kv"
)

// Each replica serves the API and KDS; what must happen once (the tombstone
// window, the first creation of signing keys and the KDS certificate) runs
// under etcd election or lock. A replica that cannot reach a quorum turns
// unready, refuses writes and KDS streams and ends the ones it serves, so a
// zone moves to another replica instead of being fed a stale view.

// EtcdConfig selects and reaches the etcd store (global only).
type EtcdConfig struct {
	Endpoints []string
	// Prefix of every key (default /meridian/).
	Prefix string
	// CAFile verifies the members; CertFile/KeyFile authenticate this
	// replica to them (mutual TLS). All empty: plain http endpoints.
	CAFile, CertFile, KeyFile string
	// MaxTxnOps and MaxTxnBytes: the cluster's --max-txn-ops and
	// --max-request-bytes (0 = etcd's defaults).
	MaxTxnOps, MaxTxnBytes int
	// SecretsKeyFile holds the 32-byte key (raw, hex or base64) that
	// encrypts the replicas' shared key material in etcd. Required.
	SecretsKeyFile string
	// Name identifies this replica in the election (default: host and API
	// address).
	Name string
}

// Health timing: a replica that has not completed a quorum read for
// unhealthyAfter stops serving. unhealthyAfter must outlast the election
// that follows the loss of the etcd leader (one member of three down must
// change nothing: at 3 s a replica under CI load, 2 cores running the whole
// test suite, turned unready during one and refused 20 writes in a row),
// and stay under the store's request timeout (etcdstore's default 5 s), so
// that by the time a write fails for lack of quorum the replica is unready
// and refuses reads (they could be stale) and KDS streams.
const (
	healthInterval = time.Second
	healthTimeout  = 1500 * time.Millisecond
	unhealthyAfter = 4500 * time.Millisecond
	electionTTL    = 5 // seconds
)

// ErrStoreLost is why a replica without its quorum refuses and ends work.
var ErrStoreLost = errors.New("this global replica lost its etcd quorum; reconnect to another replica")

// Replica is one global replica's link to etcd: client, store, health and
// election. Its methods are safe for concurrent use.
type Replica struct {
	cfg   EtcdConfig
	cli   *clientv3.Client
	store *etcdstore.Store
	log   hclog.Logger

	lastOK  atomic.Int64 // unix nanos of the last quorum read
	mu      sync.Mutex
	lastErr error
	onLost  []func()
	leading atomic.Bool
	// bundle is the last shared-secrets value this replica wrote or
	// took, so its watch skips its own writes.
	bundle []byte
}

// Config opens a Replica.
type Config struct {
	// SecretTypes are the types whose specs the store seals with the
	// secrets key (resource.Registry.SecretTypes).
	SecretTypes []string
	Etcd        EtcdConfig
	// APIAddress names the replica when Etcd.Name is empty.
	APIAddress string
	// TombstoneRetention is the store's (see etcdstore.Config).
	TombstoneRetention time.Duration
	Logger             hclog.Logger
}

// Open connects to etcd and opens the shared store.
func Open(ctx context.Context, cfg Config) (*Replica, error) {
	e := cfg.Etcd
	if len(e.Endpoints) == 0 {
		return nil, errors.New("--etcd-endpoints is required with --store etcd")
	}
	if e.SecretsKeyFile == "" {
		return nil, errors.New("--etcd-secrets-key-file is required with --store etcd: the replicas' shared signing keys are " +
			"kept in etcd encrypted with it (create one with: head -c 32 /dev/urandom > secrets.key)")
	}
	if e.Prefix == "" {
		e.Prefix = "/meridian/"
	}
	if !strings.HasSuffix(e.Prefix, "/") {
		e.Prefix += "/"
	}
	if e.Name == "" {
		host, _ := os.Hostname()
		e.Name = host + "/" + cfg.APIAddress
	}
	tlsCfg, err := etcdTLS(e)
	if err != nil {
		return nil, err
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: e.Endpoints, DialTimeout: 5 * time.Second, TLS: tlsCfg,
		Logger: zap.NewNop(), DialKeepAliveTime: 5 * time.Second, DialKeepAliveTimeout: 2 * time.Second})
	if err != nil {
		return nil, fmt.Errorf("etcd %s: %w", strings.Join(e.Endpoints, ","), err)
	}
	key, err := readSecretsKey(e.SecretsKeyFile)
	if err != nil {
		_ = cli.Close()
		return nil, err
	}
	sealer, err := kv.NewSealer(key, cfg.SecretTypes...)
	if err != nil {
		_ = cli.Close()
		return nil, err
	}
	store, err := etcdstore.Open(ctx, etcdstore.Config{Client: cli, Sealer: sealer, Prefix: e.Prefix, Logger: cfg.Logger.Named("store"),
		TombstoneRetention: cfg.TombstoneRetention, CompactEtcd: true, MaxTxnOps: e.MaxTxnOps, MaxTxnBytes: e.MaxTxnBytes})
	if err != nil {
		_ = cli.Close()
		return nil, fmt.Errorf("etcd %s: %w", strings.Join(e.Endpoints, ","), err)
	}
	r := &Replica{cfg: e, cli: cli, store: store, log: cfg.Logger.Named("ha")}
	r.lastOK.Store(time.Now().UnixNano())
	cfg.Logger.Info("store is etcd", "endpoints", strings.Join(e.Endpoints, ","), "prefix", e.Prefix, "replica", e.Name)
	return r, nil
}

func etcdTLS(e EtcdConfig) (*tls.Config, error) {
	if e.CAFile == "" && e.CertFile == "" && e.KeyFile == "" {
		return nil, nil
	}
	c := &tls.Config{MinVersion: tls.VersionTLS12}
	if e.CAFile != "" {
		pem, err := os.ReadFile(e.CAFile)
		if err != nil {
			return nil, fmt.Errorf("--etcd-ca-file: %w", err)
		}
		c.RootCAs = x509.NewCertPool()
		if !c.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--etcd-ca-file %s: no PEM certificate in it", e.CAFile)
		}
	}
	if (e.CertFile == "") != (e.KeyFile == "") {
		return nil, errors.New("--etcd-cert-file and --etcd-key-file go together")
	}
	if e.CertFile != "" {
		pair, err := tls.LoadX509KeyPair(e.CertFile, e.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("--etcd-cert-file/--etcd-key-file: %w", err)
		}
		c.Certificates = []tls.Certificate{pair}
	}
	return c, nil
}

// Store is the store the replicas share.
func (r *Replica) Store() *etcdstore.Store { return r.store }

// Close closes the store and the etcd client.
func (r *Replica) Close() {
	if err := r.store.Close(); err != nil {
		r.log.Error("closing store", "error", err)
	}
	_ = r.cli.Close()
}

// Ready is nil while the replica reaches a quorum.
func (r *Replica) Ready() error {
	if time.Since(time.Unix(0, r.lastOK.Load())) < unhealthyAfter {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return fmt.Errorf("%w (%v)", ErrStoreLost, r.lastErr)
}

// WhenLost registers fn to run each time the replica turns unhealthy.
func (r *Replica) WhenLost(fn func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.onLost = append(r.onLost, fn)
}

// Monitor reads from etcd with a quorum every healthInterval and flips the
// replica's health; it returns when ctx ends.
func (r *Replica) Monitor(ctx context.Context) error {
	t := time.NewTicker(healthInterval)
	defer t.Stop()
	healthy := true
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		cctx, cancel := context.WithTimeout(ctx, healthTimeout)
		err := r.store.Ping(cctx)
		cancel()
		if err == nil {
			r.lastOK.Store(time.Now().UnixNano())
		} else if ctx.Err() == nil {
			r.mu.Lock()
			r.lastErr = err
			r.mu.Unlock()
		}
		switch now := r.Ready() == nil; {
		case healthy && !now:
			r.log.Error("lost the etcd quorum: refusing reads, writes and KDS, ending zone streams", "error", err)
			r.mu.Lock()
			fns := append([]func(){}, r.onLost...)
			r.mu.Unlock()
			for _, fn := range fns {
				fn()
			}
			healthy = false
		case !healthy && now:
			r.log.Info("etcd quorum is back: serving again")
			healthy = true
		}
	}
}

// Lead campaigns for leadership and runs singletons while elected; when
// the lease is lost (this replica cut off from etcd) they are cancelled
// and the replica campaigns again.
func (r *Replica) Lead(ctx context.Context, singletons ...func(context.Context) error) error {
	for ctx.Err() == nil {
		if err := r.leadOnce(ctx, singletons); err != nil && ctx.Err() == nil {
			r.log.Warn("election", "error", err)
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
	}
	return nil
}

func (r *Replica) leadOnce(ctx context.Context, singletons []func(context.Context) error) error {
	sess, err := concurrency.NewSession(r.cli, concurrency.WithTTL(electionTTL), concurrency.WithContext(ctx))
	if err != nil {
		return err
	}
	defer sess.Close()
	e := concurrency.NewElection(sess, r.cfg.Prefix+"election/")
	if err := e.Campaign(ctx, r.cfg.Name); err != nil {
		return err
	}
	r.leading.Store(true)
	defer r.leading.Store(false)
	r.log.Info("elected: running the singletons (tombstone expiry)", "replica", r.cfg.Name)
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	for _, fn := range singletons {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := fn(lctx); err != nil {
				r.log.Error("singleton failed", "error", err)
			}
		}()
	}
	select {
	case <-sess.Done():
		r.log.Warn("lost leadership (lease expired)")
	case <-ctx.Done():
	}
	cancel()
	wg.Wait()
	rctx, rcancel := context.WithTimeout(context.Background(), time.Second)
	defer rcancel()
	_ = e.Resign(rctx)
	return nil
}

// sharedSecretFiles are the data-dir files every replica must hold alike:
// the zone token keys (and retired ones), the user token key, the admin
// token and the generated KDS certificate.
func sharedSecretFiles(dataDir string) ([]string, error) {
	files := []string{auth.SigningKeyFileName, auth.UserSigningKeyFileName, auth.AdminTokenFileName,
		auth.GeneratedCertFileName, auth.GeneratedKeyFileName}
	prev := filepath.Join(dataDir, auth.PreviousKeysDir)
	entries, err := os.ReadDir(prev)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	for _, e := range entries {
		files = append(files, filepath.Join(auth.PreviousKeysDir, e.Name()))
	}
	return files, nil
}

// ShareSecrets makes the data dir hold the same key material as every other
// replica: under an etcd lock, the first replica generates it (the
// single-node code paths, into its data dir) and stores it in etcd,
// encrypted with the secrets key; later replicas write etcd's copy into
// their data dir. generate runs the single-node creation.
func (r *Replica) ShareSecrets(ctx context.Context, dataDir string, generate func() error) error {
	key, err := readSecretsKey(r.cfg.SecretsKeyFile)
	if err != nil {
		return err
	}
	lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	unlock, err := r.Lock(lctx, "secrets-lock/")
	if err != nil {
		return err
	}
	defer unlock()
	resp, err := r.cli.Get(lctx, r.bundleKey())
	if err != nil {
		return fmt.Errorf("read the shared secrets: %w", err)
	}
	if len(resp.Kvs) == 1 {
		files, err := r.takeBundle(key, dataDir, resp.Kvs[0].Value)
		if err != nil {
			return err
		}
		r.log.Info("shared keys and certificate taken from etcd", "files", files)
		return nil
	}
	if err := generate(); err != nil {
		return err
	}
	n, err := r.putBundle(lctx, key, dataDir)
	if err != nil {
		return err
	}
	r.log.Info("shared keys and certificate created and stored in etcd (encrypted)", "files", n)
	return nil
}

func (r *Replica) bundleKey() string { return r.cfg.Prefix + "secrets/bundle" }

// takeBundle writes a sealed bundle's files into the data dir, removing
// retired zone token keys the bundle no longer holds.
func (r *Replica) takeBundle(key []byte, dataDir string, sealed []byte) (int, error) {
	files, err := openBundle(key, []byte(r.cfg.Prefix), sealed)
	if err != nil {
		return 0, err
	}
	if err := writeSecretFiles(dataDir, files); err != nil {
		return 0, err
	}
	prev, _ := os.ReadDir(filepath.Join(dataDir, auth.PreviousKeysDir))
	for _, e := range prev {
		name := filepath.Join(auth.PreviousKeysDir, e.Name())
		if _, ok := files[name]; !ok {
			_ = os.Remove(filepath.Join(dataDir, name))
		}
	}
	r.mu.Lock()
	r.bundle = append([]byte(nil), sealed...)
	r.mu.Unlock()
	return len(files), nil
}

// putBundle seals the data dir's shared files and stores them in etcd.
func (r *Replica) putBundle(ctx context.Context, key []byte, dataDir string) (int, error) {
	names, err := sharedSecretFiles(dataDir)
	if err != nil {
		return 0, err
	}
	files := map[string][]byte{}
	for _, n := range names {
		b, err := os.ReadFile(filepath.Join(dataDir, n))
		if errors.Is(err, fs.ErrNotExist) {
			continue // e.g. no generated certificate when --tls-cert-file is given
		}
		if err != nil {
			return 0, err
		}
		files[n] = b
	}
	sealed, err := sealBundle(key, []byte(r.cfg.Prefix), files)
	if err != nil {
		return 0, err
	}
	if _, err := r.cli.Put(ctx, r.bundleKey(), string(sealed)); err != nil {
		return 0, fmt.Errorf("store the shared secrets: %w", err)
	}
	r.mu.Lock()
	r.bundle = sealed
	r.mu.Unlock()
	return len(files), nil
}

// PublishSecrets stores this replica's key files after it rotated or
// retired a zone token key; the other replicas' watchSecrets take them.
func (r *Replica) PublishSecrets(dataDir string) error {
	key, err := readSecretsKey(r.cfg.SecretsKeyFile)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	unlock, err := r.Lock(ctx, "secrets-lock/")
	if err != nil {
		return err
	}
	defer unlock()
	_, err = r.putBundle(ctx, key, dataDir)
	return err
}

// WatchSecrets takes the key files another replica publishes and calls
// changed (the key ring rereads them). It returns when ctx ends.
func (r *Replica) WatchSecrets(ctx context.Context, dataDir string, changed func() error) error {
	key, err := readSecretsKey(r.cfg.SecretsKeyFile)
	if err != nil {
		return err
	}
	for ctx.Err() == nil {
		wch := r.cli.Watch(clientv3.WithRequireLeader(ctx), r.bundleKey())
		for resp := range wch {
			for _, ev := range resp.Events {
				if ev.Type != clientv3.EventTypePut {
					continue
				}
				r.mu.Lock()
				own := string(ev.Kv.Value) == string(r.bundle)
				r.mu.Unlock()
				if own {
					continue
				}
				if _, err := r.takeBundle(key, dataDir, ev.Kv.Value); err != nil {
					r.log.Error("cannot take the shared keys another replica published", "error", err)
					continue
				}
				if err := changed(); err != nil {
					r.log.Error("reloading the shared keys", "error", err)
				}
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
	return nil
}

// Lock takes an etcd mutex under the prefix (released by the returned
// func, or by the lease's expiry if this replica dies holding it).
func (r *Replica) Lock(ctx context.Context, name string) (func(), error) {
	sess, err := concurrency.NewSession(r.cli, concurrency.WithTTL(electionTTL), concurrency.WithContext(ctx))
	if err != nil {
		return nil, fmt.Errorf("etcd session: %w", err)
	}
	mu := concurrency.NewMutex(sess, r.cfg.Prefix+name)
	if err := mu.Lock(ctx); err != nil {
		sess.Close()
		return nil, fmt.Errorf("etcd lock %s: %w", name, err)
	}
	return func() {
		uctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = mu.Unlock(uctx)
		sess.Close()
	}, nil
}

func readSecretsKey(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--etcd-secrets-key-file: %w", err)
	}
	if err := auth.CheckPrivateFile(path); err != nil {
		return nil, fmt.Errorf("--etcd-secrets-key-file: %w", err)
	}
	if len(b) == 32 {
		return b, nil
	}
	s := strings.TrimSpace(string(b))
	if k, err := hex.DecodeString(s); err == nil && len(k) == 32 {
		return k, nil
	}
	if k, err := base64.StdEncoding.DecodeString(s); err == nil && len(k) == 32 {
		return k, nil
	}
	return nil, fmt.Errorf("--etcd-secrets-key-file %s: want 32 bytes (raw, 64 hex digits or base64), found %d bytes", path, len(b))
}

func sealBundle(key, aad []byte, files map[string][]byte) ([]byte, error) {
	plain, err := json.Marshal(files)
	if err != nil {
		return nil, err
	}
	gcm, err := newGCM(key)
	if err != nil {
		return nil, err
	}
	nonce := make([]byte, gcm.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return nil, err
	}
	return gcm.Seal(nonce, nonce, plain, aad), nil
}

func openBundle(key, aad, sealed []byte) (map[string][]byte, error) {
	gcm, err := newGCM(key)
	if err != nil {
		return nil, err
	}
	if len(sealed) < gcm.NonceSize() {
		return nil, errors.New("the shared secrets in etcd are truncated")
	}
	plain, err := gcm.Open(nil, sealed[:gcm.NonceSize()], sealed[gcm.NonceSize():], aad)
	if err != nil {
		return nil, errors.New("cannot decrypt the shared secrets in etcd: --etcd-secrets-key-file differs from the one " +
			"the first replica used")
	}
	var files map[string][]byte
	if err := json.Unmarshal(plain, &files); err != nil {
		return nil, fmt.Errorf("shared secrets: %w", err)
	}
	return files, nil
}

func newGCM(key []byte) (cipher.AEAD, error) {
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(block)
}

// writeSecretFiles writes etcd's copy into the data dir (0600; names are
// checked to stay inside it).
func writeSecretFiles(dataDir string, files map[string][]byte) error {
	for name, b := range files {
		if !filepath.IsLocal(name) {
			return fmt.Errorf("shared secrets: unexpected file name %q", name)
		}
		p := filepath.Join(dataDir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			return err
		}
		if err := os.WriteFile(p+".tmp", b, 0o600); err != nil {
			return err
		}
		if err := os.Rename(p+".tmp", p); err != nil {
			return err
		}
	}
	return nil
}
