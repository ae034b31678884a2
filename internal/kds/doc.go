// Package kds is Meridian's multizone sync engine (docs/kds.md): the global
// control plane's SyncService server (NewServer) and the zone control
// plane's client (NewClient), which stream resources both ways over one
// bidirectional gRPC stream per zone (proto/meridian/sync/v1).
//
// # Structure of one stream
//
// Both ends run the same session (session.go):
//
//   - one receive goroutine that only calls Recv and feeds a channel;
//   - one select loop that owns every piece of stream state: the outbound
//     side (outbound.go: the local store's watch, filtered and mapped per
//     peer, chunked under MaxBatchBytes, a bounded window of unacknowledged
//     batches, a partial batch held while an earlier one is unanswered so
//     that a busy peer gets fewer, larger batches, partial batches paced
//     while a stream is busy (pacer.go: after a batch of several changes
//     the next waits BatchInterval; single changes never wait), NACK
//     retries) and the
//     inbound side (inbound.go: applying the peer's batches in one store
//     transaction with the peer's revision in the store's Meta,
//     full-snapshot staging, ACK/NACK);
//   - one sender, the only caller of Send, fed by the loop.
//
// Nothing here polls: the loop wakes on a received message, a store event, a
// free send slot, or a timer (heartbeat, resume confirmation, NACK backoff,
// pacing).
//
// # Resume
//
// Each side records, in the same transaction as the batch, the last revision
// of the other side it applied (Meta keys MetaKeyGlobalRevision in a zone and
// MetaKeyZoneRevision(zone) on the global). A reconnecting sender resumes its
// store watch from that revision; when the store's history no longer reaches
// back that far (storage.ErrCompacted), or there is no resume point, it sends
// a full snapshot instead, which the receiver stages until its last chunk
// and then applies together with the deletion of every synced resource the
// snapshot does not contain, in one transaction. A zone whose store takes a
// batch in parts (storage.Streaming: the embedded store) writes the chunks
// into that transaction as they arrive, from the second one on when it came
// within 250 ms of the first (streamStartGap), so that only the commit is
// left after the last one; the store rolls the stream back if the global
// stalls between chunks (its other writers wait meanwhile), and the staged
// snapshot is then applied whole. The global never streams a zone's
// snapshot: its writers must not wait on any one zone. A snapshot's chunks start
// at a sixteenth of MaxBatchBytes and double up to it, and each is mapped
// only once the sender took the previous one, so the receiver validates the
// first resources while the rest are still being mapped and sent.
//
// A revision is recorded only once the sender knows it is complete (see
// outbound): the store's watch marks the last event of each revision
// (storage.Event.Last), so the batch that completes a revision carries
// last_chunk and the receiver records it as it applies; revisions with
// nothing for the peer are stamped by an empty marker batch after
// StreamConfig.ResumeConfirmDelay, or at once when a session drains (the
// global's Shutdown, the end of the zone's Run: pending batches and the
// stamp go out and their answers are awaited up to DrainTimeout). A
// reconnect sends exactly what the peer had not applied; without changes,
// no resources.
//
// Each store has a random id (storage.Store.ID; a store restored from a
// backup gets a new one). The handshake carries the zone's id and the id of
// the global store its resume point belongs to, the response the global's
// id, and each side records the peer's id with its resume point: a replaced
// store on either side is answered with a full snapshot, which replaces the
// stale copies.
//
// The package uses the store only through its own narrow Store interface,
// and both ends build their sessions with one constructor (newSession).
//
// # Authentication, reports, rejections
//
// A zone authenticates in the stream's metadata (MetadataZone,
// MetadataAuthorization) before the global reads any message; the stream
// ends when its token expires, its signing key retires, or EndStreams is
// called (revocation, a disabled zone). With the policy-status feature the
// zone sends PolicyStatusReports (PolicyStatuses on the global), in chunks
// of at most 256 KiB that leave only when no batch, answer or heartbeat
// waits; the global folds each chunk in as it arrives and keeps every
// zone's last report compactly (reports.go). Each sender
// records what its peer NACKed (Client.Rejected, Server.RejectedBy) until a
// later batch is accepted. On the global, every batch from a zone applies
// with the ZoneAdmission precondition in its transaction; on a zone, every
// batch from the global with the GlobalAdmission precondition (it never
// overwrites or removes one of the zone's own resources).
//
// # What flows where
//
// The scope filters and name/label/reference mappings are the pure functions
// of package mapping: global -> every zone: global-originated resources of
// types with Sync.GlobalToZone (Mesh unhashed, everything else hashed);
// zone -> global: every resource the zone wrote of types with
// Sync.ZoneToGlobal (policies of all roles, Dataplanes, MeshServices);
// global -> other zones: MeshServices and producer policies of custom
// namespaces not referencing a MeshExternalService. kuma.io/kds-sync:
// disabled never moves. The global forces kuma.io/zone to the authenticated
// zone and refuses resources claiming global origin, another zone, or a name
// held by a resource that is not the zone's.
//
// # Wiring
//
// Global (cmd/global via internal/controlplane):
//
//	ring, _ := auth.LoadZoneKeyRing(dataDir, nil)            // wrapped by the zone access checks
//	tlsMat, _ := auth.LoadOrCreateServerTLS(auth.ServerTLSConfig{DataDir: dataDir, CertFile: cert, KeyFile: key})
//	srv, _ := sync.NewServer(sync.ServerConfig{Store: store, Registry: reg, Authenticator: access,
//		Admission: adm, Logger: log.Named("kds"), SoftwareVersion: version.Version, Metrics: promRegistry})
//	gs := grpc.NewServer(grpc.Creds(credentials.NewTLS(tlsMat.Config)), grpc.MaxRecvMsgSize(6<<20))
//	// upserts are encoded once for every zone (zonecache.go): the proto codec copies their bytes
//	syncv1.RegisterSyncServiceServer(gs, srv)
//	// gzip: encoding.RegisterCompressor(sync.NewGzipCompressor(sync.DefaultDeflateFrom)) before any stream
//	// (RegisterGzip): stored blocks under 4 KiB, level 1 above; any gzip peer reads both.
//	go gs.Serve(kdsListener)
//	// on shutdown: srv.Shutdown(); gs.GracefulStop()
//	// API: srv.Statuses() for GET /zones, srv.Status(name) for /zones/{name}/_overview,
//	//      tokens.Issue(zone, validFor) for POST /tokens/zone.
//
// Zone (cmd/zone, when --global-address is set):
//
//	tc, _ := auth.ClientTLS(auth.ClientTLSConfig{CAFile: caFile, SkipVerify: skipVerify})
//	adm, _ := admission.New(admission.Config{Registry: reg, Mode: admission.Zone, Zone: zone,
//		Environment: env, SystemNamespace: sysNS, Federated: true})
//	c, _ := sync.NewClient(sync.ClientConfig{Store: store, Registry: reg, Zone: zone,
//		Environment: env, SystemNamespace: sysNS, Target: globalAddress, Admission: adm,
//		Token: func() (string, error) { b, err := os.ReadFile(tokenFile); return strings.TrimSpace(string(b)), err },
//		DialOptions: []grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(tc)),
//			grpc.WithDefaultCallOptions(grpc.UseCompressor(sync.GzipName), grpc.MaxCallRecvMsgSize(16<<20))},
//		Logger: log.Named("kds"), SoftwareVersion: version.Version, Metrics: promRegistry})
//	go c.Run(ctx) // returns nil when ctx ends; c.Status() for the zone's own API
package kds
