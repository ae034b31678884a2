package boltstore

import (
	"bytes"
	"context"
	"fmt"

	bolt "go.etcd.io/bbolt"

	"github.com/meridian-mesh/meridian/internal/resource"
	"github.com/meridian-mesh/meridian/internal/storage"
	"github.com/meridian-mesh/meridian/internal/storage/kv"
)

// List implements storage.Store: one prefix scan of the resources bucket in
// a single read transaction, so a page is a consistent snapshot. Resources
// outside the page are decoded only when a label filter needs them.
func (s *Store) List(ctx context.Context, opts storage.ListOptions) (*storage.ListResult, error) {
	if err := kv.ValidateList(opts); err != nil {
		return nil, err
	}
	var out *storage.ListResult
	err := s.view(ctx, func(tx *bolt.Tx) (err error) {
		out, err = scan(ctx, s.cfg.Sealer, tx.Bucket([]byte(bucketResources)), opts)
		return err
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// ctxCheckEvery is how many keys a scan visits between context checks.
const ctxCheckEvery = 1024

func scan(ctx context.Context, sealer *kv.Sealer, b *bolt.Bucket, opts storage.ListOptions) (*storage.ListResult, error) {
	prefix := kv.ListPrefix(opts)
	// The prefix pins the namespace only when the mesh is set too.
	checkNamespace := opts.Namespace != nil && opts.Mesh == ""
	out := &storage.ListResult{Items: []*resource.Resource{}}
	c := b.Cursor()
	visited := 0
	for k, v := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, v = c.Next() {
		if visited++; visited%ctxCheckEvery == 0 {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
		}
		if checkNamespace && !kv.NamespaceIs(k, *opts.Namespace) {
			continue
		}
		var r *resource.Resource
		if len(opts.Labels) > 0 {
			if match, err := recordHasLabels(v, opts.Labels); err != nil {
				return nil, fmt.Errorf("boltstore: resource %q: %w", k, err)
			} else if !match {
				continue
			}
			rec, err := decodeListed(sealer, k, v)
			if err != nil {
				return nil, err
			}
			r = rec.res
		}
		out.Total++
		if out.Total <= opts.Offset || (opts.Limit > 0 && len(out.Items) >= opts.Limit) {
			continue
		}
		if r == nil {
			rec, err := decodeListed(sealer, k, v)
			if err != nil {
				return nil, err
			}
			r = rec.res
		}
		out.Items = append(out.Items, r)
	}
	return out, nil
}

func decodeListed(sealer *kv.Sealer, k, v []byte) (record, error) {
	rec, err := decodeRecord(sealer, v)
	if err != nil {
		return record{}, fmt.Errorf("boltstore: resource %q: %w", k, err)
	}
	return rec, nil
}
