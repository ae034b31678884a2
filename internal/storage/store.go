// Package storage holds resources. Store is the one interface every backend
// implements; bbolt (package storage/boltstore) is the embedded default. The
// conformance suite in storage/storagetest defines the contract in tests.
package storage

import (
	"context"
	"errors"

	"github.com/meridian-mesh/meridian/internal/resource"
)

// Errors a Store returns; wrap-aware callers test them with errors.Is.
var (
	ErrNotFound      = errors.New("resource not found")
	ErrAlreadyExists = errors.New("resource already exists")
	// ErrConflict: the write carried a Version that is not the stored one.
	ErrConflict = errors.New("version conflict")
	// ErrCompacted: a watch asked for changes older than the retained history
	// (tombstones past the retention window); the caller must resync in full.
	ErrCompacted = errors.New("revision compacted")
	// ErrNewerSchema: the data file was written by a newer Meridian.
	ErrNewerSchema = errors.New("store schema is newer than this binary supports")
	ErrClosed      = errors.New("store closed")
	// ErrInvalid: the request cannot be stored as given (empty type or name,
	// a NUL byte in a key, a List without Type, a negative Offset or Limit).
	ErrInvalid = errors.New("invalid storage request")
	// ErrTooLarge: one write is bigger than the backend can commit at once
	// (etcd's per-transaction operation and byte limits); see Limits.
	ErrTooLarge = errors.New("write exceeds the store's transaction limits")
	// ErrUnavailable: the backend cannot answer now (no etcd quorum, a
	// partition); the caller may retry later. Nothing was written, unless
	// the error says that a commit's outcome could not be learned.
	ErrUnavailable = errors.New("store unavailable")
	// ErrStreamAbandoned: an ApplyStream was rolled back because its writer
	// went quiet (or held it) longer than the store allows; nothing of it
	// was written.
	ErrStreamAbandoned = errors.New("apply stream abandoned")
)

// Store is safe for concurrent use. Resources passed in are not retained;
// resources returned are owned by the caller.
//
// Every successful write bumps the store-wide revision by exactly one (a batch
// is one write). Version on a resource counts writes to that resource
// (1 on create). A write whose Version is non-zero must match the stored
// Version or fail with ErrConflict.
type Store interface {
	Get(ctx context.Context, key resource.Key) (*resource.Resource, error)
	List(ctx context.Context, opts ListOptions) (*ListResult, error)

	// Create fails with ErrAlreadyExists; it sets CreationTime,
	// ModificationTime and Version=1.
	Create(ctx context.Context, r *resource.Resource) (*resource.Resource, error)
	// Update fails with ErrNotFound or ErrConflict.
	Update(ctx context.Context, r *resource.Resource) (*resource.Resource, error)
	// Put creates or updates. When labels, spec and status equal the stored
	// ones nothing is written and the outcome is Unchanged.
	Put(ctx context.Context, r *resource.Resource) (*resource.Resource, Outcome, error)
	// Delete fails with ErrNotFound; with version != 0, ErrConflict on mismatch.
	Delete(ctx context.Context, key resource.Key, version uint64) error

	// Apply writes a batch in one transaction: all or nothing, one revision.
	Apply(ctx context.Context, b Batch) (*BatchResult, error)

	// Meta reads a value written by Batch.Meta (e.g. a peer's resume revision).
	Meta(ctx context.Context, key string) ([]byte, error)

	// Revision is the revision of the last committed write (0 when empty).
	Revision(ctx context.Context) (uint64, error)

	// Watch delivers every change with revision > from, in revision order, then
	// live changes, until ctx ends or the store closes (the channel is closed).
	// A put that a later write to the same key supersedes may be skipped
	// during catch-up: the watcher sees each key's latest state, and every
	// delete. from below CompactedRevision yields ErrCompacted.
	Watch(ctx context.Context, from uint64) (<-chan Event, error)

	// ID is a random id the store got at creation; it stays across
	// restarts. A store created anew (a wiped data dir) gets another one, and
	// so does a store restored from a backup (its revisions are older than
	// the ones peers saw). Sync peers compare it with the id they remember to
	// tell a replaced store from one that resumes.
	ID() string

	// CompactedRevision is the highest revision whose history (tombstones) was
	// dropped; watching from below it is impossible.
	CompactedRevision(ctx context.Context) (uint64, error)

	Close() error
}

// Outcome of a Put.
type Outcome int

const (
	Created Outcome = iota + 1
	Updated
	Unchanged
)

func (o Outcome) String() string {
	switch o {
	case Created:
		return "created"
	case Updated:
		return "updated"
	case Unchanged:
		return "unchanged"
	}
	return "unknown"
}

// ListOptions filter a List. Zero values mean "any".
type ListOptions struct {
	Type string // required
	Mesh string
	// Namespace, when non-nil, keeps only resources in that namespace ("" is
	// the system namespace).
	Namespace *string
	// Labels keeps resources carrying every key with the given value.
	Labels map[string]string
	// Offset and Limit page through the sorted (mesh, namespace, name) order;
	// Limit 0 means all.
	Offset int
	Limit  int
}

// ListResult is one page; Total counts every match across pages.
type ListResult struct {
	Items []*resource.Resource
	Total int
}

// Batch is a set of writes applied atomically. Puts apply in order, then
// Deletes, each seeing the effect of the ones before it (a key may appear
// more than once). A batch that changes no resource (every put Unchanged,
// every delete absent) does not bump the revision, even if it writes Meta.
type Batch struct {
	// Puts create or update; a Version of 0 skips the concurrency check.
	Puts []*resource.Resource
	// Deletes of absent keys are ignored (sync may repeat a removal).
	Deletes []resource.Key
	// Meta entries are stored in the same transaction.
	Meta map[string][]byte
	// Owned: the caller hands the Puts' resources over and never reads or
	// changes them (their labels, spec and status) again, so the store may
	// keep them as stored instead of copying them first (the Store
	// contract's "not retained" is waived for this batch). The store still
	// never changes them. Sync sets it for what it receives: a cold zone's
	// 100,000 puts spent a tenth of their apply copying resources that were
	// dropped right after.
	Owned bool
	// Check, when set, runs inside the batch's transaction before anything
	// is written, reading the state the batch will apply to (including
	// writes committed just before it in the same group). It may veto the
	// batch (its error is returned, wrapped, and nothing is written) or
	// extend it with more deletions, applied after Deletes: a precondition
	// or a cascade that must see the same state as the write, with no
	// check-then-write race. It may run more than once (a retried group)
	// and must be a pure function of what it reads.
	Check func(tx TxReader) (moreDeletes []resource.Key, err error)
}

// Limits are what one write may hold at most; zero means unbounded.
type Limits struct {
	// Ops counts puts, deletes (including a Check's) and meta entries.
	Ops int
	// Bytes counts the encoded resources, keys and meta values.
	Bytes int
}

// Limited is implemented by a Store whose writes have limits (etcd): a
// writer that splits its work (sync applying a large batch) keeps each
// Batch within them.
type Limited interface {
	Limits() Limits
}

// Streaming is implemented by a Store that can take one Batch's puts in
// parts while they are still being produced (a full snapshot arriving in
// chunks): each part is written into one open transaction at once, and
// nothing is visible, to readers or watchers, until Commit, which makes
// the whole a single revision, exactly as one Apply of the whole batch
// would. The writing then overlaps the producing.
//
// While a stream is open, the store's other writes wait. So that a stalled
// producer cannot hold them, the store rolls a stream back when no part has
// come for a while or when it has been open too long (the store's limits):
// Put and Commit then fail with ErrStreamAbandoned, and the caller applies
// its batch in one Apply instead.
type Streaming interface {
	// BeginApply opens a stream. ctx bounds the wait for the store's
	// writer, not the stream's life.
	BeginApply(ctx context.Context) (ApplyStream, error)
}

// ApplyStream is one batch being applied in parts; see Streaming. It is
// used by one goroutine.
type ApplyStream interface {
	// Put writes part's Puts after those of earlier parts, with the
	// semantics of Batch.Puts and Owned set (the caller hands them over).
	// part's Check, if any, runs in the transaction just before they are
	// written, seeing the earlier parts; its extra deletions are applied at
	// Commit. Deletes and Meta belong in Commit's batch, not in a part. Put
	// may return before the part is written: a failure to write it (a
	// Check's veto included) is returned by a later Put or by Commit, and
	// fails the whole stream.
	Put(part Batch) error
	// Commit writes rest after every part (its Puts, Deletes, Check and
	// Meta, as an Apply would) and commits everything as one revision. The
	// result's Outcomes and Stored cover rest.Puts only.
	Commit(rest Batch) (*BatchResult, error)
	// Abort rolls the stream back. It may be called at any time, also after
	// Commit or another Abort, where it does nothing.
	Abort()
}

// TxReader reads inside a write transaction (Batch.Check).
type TxReader interface {
	// Get returns the stored resource or an error wrapping ErrNotFound.
	Get(key resource.Key) (*resource.Resource, error)
	// List is Store.List inside the transaction.
	List(opts ListOptions) (*ListResult, error)
}

// BatchResult reports what a batch did.
type BatchResult struct {
	Revision uint64
	Outcomes []Outcome // one per Put, in order
	// Stored are the resources as stored, one per Put (for an Unchanged put,
	// the resource already stored).
	Stored  []*resource.Resource
	Deleted int
}

// EventKind tells a put from a delete.
type EventKind int

const (
	EventPut EventKind = iota + 1
	EventDelete
)

// Event is one change. For a delete, Resource holds the key fields and the
// last known labels (so filters by label still work) with Spec nil.
type Event struct {
	Kind     EventKind
	Revision uint64
	Resource *resource.Resource
	// Last marks the last event of its revision: every change of that
	// revision has been delivered (changes a later revision superseded are
	// delivered at that later revision). A consumer may treat the revision as
	// complete at once, without waiting for a later event.
	Last bool
}
