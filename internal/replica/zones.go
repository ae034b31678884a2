package replica

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/meridian-mesh/meridian/internal/kds"
)

// Zone status across replicas. Each replica's tracker knows the streams it
// serves; a zone connected to replica A must not look offline on replica
// B's API and console. So each replica publishes the status of every zone
// it serves under P "zones/<zone>", bound to its etcd lease (a replica that
// dies takes its entries with it within the lease TTL), and GET /zones on
// any replica merges its own view with the others'.

const zoneStatusPublish = 2 * time.Second

func (r *Replica) zonesPrefix() string { return r.cfg.Prefix + "zones/" }

// PublishZones keeps this replica's connected zones in etcd until ctx ends.
func (r *Replica) PublishZones(ctx context.Context, srv *kds.Server) error {
	for ctx.Err() == nil {
		if err := r.publishZonesOnce(ctx, srv); err != nil && ctx.Err() == nil {
			r.log.Debug("publishing zone statuses", "error", err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
	return nil
}

func (r *Replica) publishZonesOnce(ctx context.Context, srv *kds.Server) error {
	sess, err := concurrency.NewSession(r.cli, concurrency.WithTTL(electionTTL), concurrency.WithContext(ctx))
	if err != nil {
		return err
	}
	defer sess.Close()
	// published holds what this lease's entries say: a status unchanged
	// since is not written again (the lease keeps the entry alive).
	published := map[string]string{}
	tick := time.NewTicker(zoneStatusPublish)
	defer tick.Stop()
	for {
		changed := srv.StatusChanged()
		for _, st := range srv.Statuses() {
			key := r.zonesPrefix() + st.Zone
			_, was := published[st.Zone]
			cctx, cancel := context.WithTimeout(ctx, healthTimeout)
			switch {
			case st.Connected:
				st.ServedBy = r.cfg.Name
				b, _ := json.Marshal(st)
				if published[st.Zone] != string(b) {
					_, err = r.cli.Put(cctx, key, string(b), clientv3.WithLease(sess.Lease()))
					published[st.Zone] = string(b)
				}
			case was:
				// Only our own entry: the zone may already be on another replica.
				_, err = r.cli.Txn(cctx).If(clientv3.Compare(clientv3.LeaseValue(key), "=", sess.Lease())).
					Then(clientv3.OpDelete(key)).Commit()
				delete(published, st.Zone)
			}
			cancel()
			if err != nil {
				return err
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-sess.Done():
			return nil // lease lost: start over with a new one
		case <-changed:
		case <-tick.C:
		}
	}
}

// WatchZones calls notify when another replica's zone entries change (the
// console's live zones page).
func (r *Replica) WatchZones(ctx context.Context, notify func()) error {
	for ctx.Err() == nil {
		for resp := range r.cli.Watch(clientv3.WithRequireLeader(ctx), r.zonesPrefix(), clientv3.WithPrefix()) {
			if len(resp.Events) > 0 {
				notify()
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
	return nil
}

// remoteZones reads the zones other replicas serve (this replica's own
// entries are skipped by the caller's merge: its tracker is fresher).
func (r *Replica) remoteZones() map[string]kds.ZoneStatus {
	ctx, cancel := context.WithTimeout(context.Background(), healthTimeout)
	defer cancel()
	resp, err := r.cli.Get(ctx, r.zonesPrefix(), clientv3.WithPrefix())
	if err != nil {
		return nil
	}
	out := map[string]kds.ZoneStatus{}
	for _, kv := range resp.Kvs {
		var st kds.ZoneStatus
		if json.Unmarshal(kv.Value, &st) == nil {
			out[strings.TrimPrefix(string(kv.Key), r.zonesPrefix())] = st
		}
	}
	return out
}

// Zones is the API's view of zones on a replica: this replica's tracker,
// with the zones another replica serves shown as connected there.
func (r *Replica) Zones(srv *kds.Server) Zones { return Zones{Server: srv, rep: r} }

// Zones serves GET /zones on a replica (api.ZoneStatuses).
type Zones struct {
	*kds.Server
	rep *Replica
}

func (z Zones) Statuses() []kds.ZoneStatus {
	return mergeStatuses(z.Server.Statuses(), z.rep.remoteZones(), z.rep.cfg.Name)
}

// mergeStatuses is what a replica shows of every zone: its own streams
// (served by self), and for a zone it does not serve, the replica that
// does.
func mergeStatuses(local []kds.ZoneStatus, remote map[string]kds.ZoneStatus, self string) []kds.ZoneStatus {
	byZone := map[string]kds.ZoneStatus{}
	for _, st := range local {
		if st.Connected {
			st.ServedBy = self
		}
		byZone[st.Zone] = st
	}
	for name, st := range remote {
		if own, ok := byZone[name]; !ok || !own.Connected {
			byZone[name] = st
		}
	}
	out := make([]kds.ZoneStatus, 0, len(byZone))
	for _, st := range byZone {
		out = append(out, st)
	}
	slices.SortFunc(out, func(a, b kds.ZoneStatus) int { return strings.Compare(a.Zone, b.Zone) })
	return out
}

func (z Zones) Status(zone string) (kds.ZoneStatus, bool) {
	own, ok := z.Server.Status(zone)
	if ok && own.Connected {
		own.ServedBy = z.rep.cfg.Name
		return own, true
	}
	if st, found := z.rep.remoteZones()[zone]; found {
		return st, true
	}
	return own, ok
}
