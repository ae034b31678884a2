package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
)

// ExpireTombstones moves the tombstone window: the newest write group
// committed more than TombstoneRetention ago becomes the compaction mark
// (watching from below it reports storage.ErrCompacted, so a peer that was
// away longer resyncs in full), and with CompactEtcd etcd's history below it
// is compacted. It returns the compacted store revision. Several replicas
// may run it; the control plane runs it on the elected one only, since etcd
// compaction is cluster-wide work.
func (s *Store) ExpireTombstones(ctx context.Context) (uint64, error) {
	if err := s.readErr(ctx); err != nil {
		return 0, err
	}
	compacted, compactedAt, err := s.compactedMark(ctx)
	if err != nil {
		return 0, err
	}
	cutoff := s.cfg.Clock.Now().Add(-s.cfg.TombstoneRetention).UnixNano()
	_, curAt, err := s.readHead(ctx, 0)
	if err != nil {
		return 0, err
	}
	// The newest group with time <= cutoff: binary search over etcd
	// revisions (head's time grows with its value; replicas' clocks may
	// differ a little, which moves the window by as much).
	var best head
	var bestAt int64
	lo, hi := max(compactedAt, 1), curAt
	for lo <= hi {
		mid := lo + (hi-lo)/2
		h, at, err := s.readHead(ctx, mid)
		if err != nil {
			return 0, err
		}
		switch {
		case at == 0: // before the store's first write
			lo = mid + 1
		case h.time <= cutoff:
			best, bestAt = h, at
			lo = mid + 1
		default:
			hi = mid - 1
		}
	}
	if bestAt == 0 || best.rev <= compacted {
		return compacted, nil
	}
	cctx, cancel := s.callCtx(ctx)
	defer cancel()
	if _, err := s.cli.Put(cctx, s.l.compacted(), string(encodeCompacted(best.rev, bestAt))); err != nil {
		return compacted, s.wrapErr(err)
	}
	if s.cfg.CompactEtcd {
		_, err := s.cli.Compact(cctx, bestAt)
		if err != nil && !isAlreadyCompacted(err) {
			return best.rev, fmt.Errorf("etcdstore: compact etcd at %d: %w", bestAt, s.wrapErr(err))
		}
	}
	s.log.Debug("tombstone window moved", "compacted", best.rev, "etcd_revision", bestAt)
	return best.rev, nil
}

func isAlreadyCompacted(err error) bool { return errors.Is(err, rpctypes.ErrCompacted) }

// RunExpiry calls ExpireTombstones every interval until ctx ends; failures
// are logged (the next pass retries).
func (s *Store) RunExpiry(ctx context.Context, interval time.Duration) error {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		if _, err := s.ExpireTombstones(ctx); err != nil && ctx.Err() == nil {
			s.log.Warn("tombstone expiry failed", "error", err)
		}
	}
}
