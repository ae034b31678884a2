package etcdstore

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/meridian-mesh/meridian/internal/resource"
	"github.com/meridian-mesh/meridian/internal/storage"
	"github.com/meridian-mesh/meridian/internal/storage/etcdstore/etcdtest"
	"github.com/meridian-mesh/meridian/internal/storage/kv"
	"github.com/meridian-mesh/meridian/internal/storage/storagetest"
)

func policy(name, spec string) *resource.Resource {
	return &resource.Resource{Type: "MeshTimeout", Mesh: "default", Name: name, Spec: []byte(spec)}
}

// TestReplicasShareOneStore: two Stores on one prefix (two control plane
// replicas) writing concurrently, each through its own etcd client, number
// every write densely and both watches see the same history.
func TestReplicasShareOneStore(t *testing.T) {
	cluster := etcdtest.Start(t, 3, etcdtest.Options{})
	var stores []*Store
	for i := range 2 {
		cli, err := clientv3.New(clientv3.Config{Endpoints: cluster.Endpoints()[i : i+1], DialTimeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cli.Close() })
		s, err := Open(t.Context(), Config{Client: cli, Prefix: "/replicas/", Logger: testLogger(t)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		stores = append(stores, s)
	}
	if stores[0].ID() != stores[1].ID() {
		t.Fatalf("replicas see different store ids %q and %q", stores[0].ID(), stores[1].ID())
	}
	w0, err := stores[0].Watch(t.Context(), 0)
	if err != nil {
		t.Fatal(err)
	}
	const writers, each = 8, 25
	var wg sync.WaitGroup
	for g := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := stores[g%2]
			for i := range each {
				if _, _, err := s.Put(t.Context(), policy(fmt.Sprintf("p-%d-%d", g, i%5), fmt.Sprintf(`{"n":%d}`, i))); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	rev, err := stores[1].Revision(t.Context())
	if err != nil || rev != writers*each {
		t.Fatalf("revision %d, %v; want %d (one per write)", rev, err, writers*each)
	}
	w1, err := stores[1].Watch(t.Context(), 0)
	if err != nil {
		t.Fatal(err)
	}
	for i := uint64(1); i <= rev; i++ {
		for _, w := range []<-chan storage.Event{w0, w1} {
			select {
			case ev := <-w:
				if ev.Revision != i || !ev.Last {
					t.Fatalf("event %d: revision %d last %v", i, ev.Revision, ev.Last)
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("event %d not delivered", i)
			}
		}
	}
}

// TestTransactionLimits: a write bigger than etcd's per-transaction limits
// is refused by design (storage.ErrTooLarge, naming the flags), never sent
// to fail in etcd; writes within the limits still group.
func TestTransactionLimits(t *testing.T) {
	cluster := etcdtest.Start(t, 1, etcdtest.Options{ExtraArgs: []string{"--max-txn-ops=16", "--max-request-bytes=100000"}})
	s, err := Open(t.Context(), Config{Client: cluster.Client(t), Prefix: "/limits/", Logger: testLogger(t), MaxTxnOps: 16, MaxTxnBytes: 100000})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var b storage.Batch
	for i := range 16 {
		b.Puts = append(b.Puts, policy(fmt.Sprintf("p%d", i), `{}`))
	}
	if _, err := s.Apply(t.Context(), b); !errors.Is(err, storage.ErrTooLarge) || !strings.Contains(err.Error(), "--max-txn-ops") {
		t.Fatalf("batch of 16 puts with 16 ops allowed: %v, want ErrTooLarge naming the flag", err)
	}
	b.Puts = b.Puts[:15]
	if _, err := s.Apply(t.Context(), b); err != nil {
		t.Fatalf("batch of 15 puts (+ head = 16 ops): %v", err)
	}
	big := policy("big", `{"x":"`+strings.Repeat("a", 90000)+`"}`)
	if _, _, err := s.Put(t.Context(), big); !errors.Is(err, storage.ErrTooLarge) {
		t.Fatalf("90 kB resource with a 100 kB request limit: %v, want ErrTooLarge", err)
	}
	var wg sync.WaitGroup
	for i := range 40 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := s.Create(t.Context(), policy(fmt.Sprintf("c%d", i), `{}`)); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if l, err := s.List(t.Context(), storage.ListOptions{Type: "MeshTimeout"}); err != nil || l.Total != 55 {
		t.Fatalf("list: %v total %d, want 55", err, l.Total)
	}
}

// TestCompactEtcd: with CompactEtcd the tombstone window also compacts
// etcd's history; a watch from before it reports ErrCompacted, one from the
// mark still works.
func TestCompactEtcd(t *testing.T) {
	cluster := etcdtest.Start(t, 1, etcdtest.Options{})
	cli := cluster.Client(t)
	clock := storagetest.NewFakeClock(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	s, err := Open(t.Context(), Config{Client: cli, Prefix: "/compact/", Logger: testLogger(t), Clock: clock,
		TombstoneRetention: time.Hour, CompactEtcd: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, name := range []string{"a", "b"} {
		if _, err := s.Create(t.Context(), policy(name, `{}`)); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Delete(t.Context(), policy("a", "").Key(), 0); err != nil {
		t.Fatal(err)
	}
	clock.Advance(2 * time.Hour)
	if _, err := s.Create(t.Context(), policy("c", `{}`)); err != nil {
		t.Fatal(err)
	}
	c, err := s.ExpireTombstones(t.Context())
	if err != nil || c != 3 {
		t.Fatalf("compacted %d, %v; want 3", c, err)
	}
	if _, err := cli.Get(t.Context(), "/compact/r.", clientv3.WithRev(2)); err == nil {
		t.Fatal("etcd still serves revision 2 after compaction")
	}
	if _, err := s.Watch(t.Context(), 2); !errors.Is(err, storage.ErrCompacted) {
		t.Fatalf("watch from 2: %v, want ErrCompacted", err)
	}
	ch, err := s.Watch(t.Context(), 3)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case ev := <-ch:
		if ev.Revision != 4 || ev.Resource.Name != "c" {
			t.Fatalf("first event after the mark: %+v", ev)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no event from the compaction mark")
	}
}

// FuzzDecodeHead: a head value from etcd (another writer, a corrupted
// cluster) never panics the watch; whatever decodes re-encodes.
func FuzzDecodeHead(f *testing.F) {
	f.Add(encodeHead(head{rev: 3, time: 42, deletes: []headDelete{{rev: 3, tomb: policy("a", "")}}}))
	f.Add([]byte{0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := decodeHead(b)
		if err != nil {
			return
		}
		if _, err := decodeHead(encodeHead(h)); err != nil {
			t.Fatalf("re-encoding a decoded head fails: %v", err)
		}
	})
}

// TestCommittedAfterLostAnswer: a commit whose answer was lost is found in
// head's history by its unique value, even after later writes moved head.
func TestCommittedAfterLostAnswer(t *testing.T) {
	cluster := etcdtest.Start(t, 1, etcdtest.Options{})
	cli := cluster.Client(t)
	s, err := Open(t.Context(), Config{Client: cli, Prefix: "/resolve/", Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Create(t.Context(), policy("a", `{}`)); err != nil {
		t.Fatal(err)
	}
	resp, err := cli.Get(t.Context(), "/resolve/r.")
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("read head: %v", err)
	}
	ours := resp.Kvs[0].Value
	for _, name := range []string{"b", "c"} {
		if _, err := s.Create(t.Context(), policy(name, `{}`)); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct {
		name string
		val  []byte
		rev  uint64
		want bool
	}{
		{"ours, head moved on since", ours, 1, true},
		{"another value at that revision", append([]byte(nil), append(ours[:len(ours):len(ours)], 'x')...), 1, false},
		{"a revision nobody reached", ours, 9, false},
	}
	for _, tc := range tests {
		got, err := s.committed(t.Context(), tc.val, tc.rev)
		if err != nil || got != tc.want {
			t.Errorf("%s: committed %v, %v; want %v", tc.name, got, err, tc.want)
		}
	}
}

// TestSealedSecretsInEtcd: a sealed type's spec is encrypted in etcd and
// read back (Get, List, Watch) in the clear.
func TestSealedSecretsInEtcd(t *testing.T) {
	cluster := etcdtest.Start(t, 1, etcdtest.Options{})
	cli := cluster.Client(t)
	sealer, err := kv.NewSealer(bytes.Repeat([]byte{3}, 32), "Secret")
	if err != nil {
		t.Fatal(err)
	}
	s, err := Open(t.Context(), Config{Client: cli, Prefix: "/sealed/", Logger: testLogger(t), Sealer: sealer})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	rev, err := s.Revision(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	events, err := s.Watch(t.Context(), rev)
	if err != nil {
		t.Fatal(err)
	}
	spec := `{"data":"aW4tdGhlLWNsZWFy"}`
	secret := &resource.Resource{Type: "Secret", Mesh: "default", Name: "k", Spec: []byte(spec)}
	if _, err := s.Create(t.Context(), secret); err != nil {
		t.Fatal(err)
	}
	resp, err := cli.Get(t.Context(), "/sealed/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range resp.Kvs {
		if bytes.Contains(kv.Value, []byte("aW4tdGhlLWNsZWFy")) {
			t.Errorf("etcd key %s holds the secret in the clear", kv.Key)
		}
	}
	if got, err := s.Get(t.Context(), secret.Key()); err != nil || string(got.Spec) != spec {
		t.Errorf("Get: %s %v", got.Spec, err)
	}
	if ev := <-events; ev.Resource == nil || string(ev.Resource.Spec) != spec {
		t.Errorf("watched: %+v", ev.Resource)
	}
}
