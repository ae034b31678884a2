package kv

import (
	"bytes"
	"fmt"
	"slices"
	"time"

	"github.com/meridian-mesh/meridian/internal/resource"
	"github.com/meridian-mesh/meridian/internal/storage"
)

type PutMode int

const (
	ModeCreate PutMode = iota
	ModeUpdate
	ModePut
)

func (m PutMode) String() string {
	switch m {
	case ModeCreate:
		return "create"
	case ModeUpdate:
		return "update"
	}
	return "put"
}

// CheckWrite enforces the Store contract's preconditions for a write.
func CheckWrite(key resource.Key, old *resource.Resource, version uint64, mode PutMode) error {
	op := mode.String()
	switch {
	case mode == ModeCreate && old != nil:
		return fmt.Errorf("%s %s: %w", op, key, storage.ErrAlreadyExists)
	case mode == ModeUpdate && old == nil:
		return fmt.Errorf("%s %s: %w", op, key, storage.ErrNotFound)
	case mode == ModeCreate || version == 0:
		return nil
	case old == nil:
		return fmt.Errorf("%s %s: version %d given but the resource does not exist: %w", op, key, version, storage.ErrConflict)
	case old.Version != version:
		return fmt.Errorf("%s %s: version %d given, stored %d: %w", op, key, version, old.Version, storage.ErrConflict)
	}
	return nil
}

// SameContent compares what a Put may change; nil and empty are equal.
func SameContent(a, b *resource.Resource) bool {
	return a.Labels.Equal(b.Labels) && bytes.Equal(a.Spec, b.Spec) && bytes.Equal(a.Status, b.Status)
}

// NextVersion builds the resource to store from the caller's: a copy of
// it, sharing its labels, spec and status when the caller handed them over
// (owned, storage.Batch.Owned). The store owns Version and the times, and
// empty labels, spec and status are stored as absent so that what a write
// returns equals what a read decodes.
func NextVersion(in *resource.Resource, old *resource.Resource, now time.Time, owned bool) (*resource.Resource, storage.Outcome) {
	var next *resource.Resource
	if owned {
		// storage.Batch.Owned: share in's labels, spec and status; set
		// the store's fields on a copy of the struct, never on in.
		c := *in
		next = &c
	} else {
		next = in.Clone()
	}
	if len(next.Spec) == 0 {
		next.Spec = nil
	}
	if len(next.Status) == 0 {
		next.Status = nil
	}
	next.ModificationTime = now
	if old == nil {
		next.Version, next.CreationTime = 1, now
		return next, storage.Created
	}
	next.Version, next.CreationTime = old.Version+1, old.CreationTime
	return next, storage.Updated
}

func ValidateResource(r *resource.Resource) error {
	if r == nil {
		return fmt.Errorf("%w: nil resource", storage.ErrInvalid)
	}
	return ValidateKey(r.Key())
}

func ValidateBatch(b storage.Batch) error {
	for i, p := range b.Puts {
		if err := ValidateResource(p); err != nil {
			return fmt.Errorf("batch put %d: %w", i, err)
		}
	}
	for i, k := range b.Deletes {
		if err := ValidateKey(k); err != nil {
			return fmt.Errorf("batch delete %d: %w", i, err)
		}
	}
	for k := range b.Meta {
		if k == "" || len(k) > MaxKeyBytes {
			return fmt.Errorf("%w: batch meta key of %d bytes", storage.ErrInvalid, len(k))
		}
	}
	return nil
}

// BatchDeletes runs the batch's Check (if any) against tx and returns the
// deletes to apply: the batch's own, then the Check's, each validated. A
// Check error is returned as is (the batch writes nothing).
func BatchDeletes(b storage.Batch, tx storage.TxReader) ([]resource.Key, error) {
	if b.Check == nil {
		return b.Deletes, nil
	}
	more, err := b.Check(tx)
	if err != nil {
		return nil, err
	}
	for i, k := range more {
		if err := ValidateKey(k); err != nil {
			return nil, fmt.Errorf("batch check delete %d: %w", i, err)
		}
	}
	return append(slices.Clone(b.Deletes), more...), nil
}
