package kds

import (
	"fmt"
	"strings"

	"github.com/meridian-mesh/meridian/internal/plane"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/meridian-mesh/meridian/internal/resource"
	syncv1 "github.com/meridian-mesh/meridian/proto/meridian/sync/v1"
)

// Conversions between the store's resources and the wire messages.

func toWire(r *resource.Resource) *syncv1.Resource {
	w := &syncv1.Resource{
		Type: r.Type, Mesh: r.Mesh, Name: r.Name, Namespace: r.Namespace,
		Labels: r.Labels.Map(), Spec: r.Spec, Status: r.Status, Version: r.Version,
	}
	if !r.CreationTime.IsZero() {
		w.CreationTime = timestamppb.New(r.CreationTime)
	}
	if !r.ModificationTime.IsZero() {
		w.ModificationTime = timestamppb.New(r.ModificationTime)
	}
	return w
}

// fromWire builds the resource a receiver validates and stores. Times and
// version are the sender's and are not kept: the receiving store sets its
// own.
func fromWire(w *syncv1.Resource) *resource.Resource {
	return &resource.Resource{
		Type: w.GetType(), Mesh: w.GetMesh(), Name: w.GetName(), Namespace: w.GetNamespace(),
		Labels: labelsFromWire(w.GetLabels(), w.GetName()), Spec: w.GetSpec(), Status: w.GetStatus(),
	}
}

// labelsFromWire returns the decoded labels with the keys the system writes,
// and the values it gives them, pointing at the program's constants instead
// of at the copies the decoder made, and a display name equal to the name at
// the name: every synced policy carries the same few (kuma.io/origin:
// global, its role, its display name), and their copies were about 8 MB of
// a zone's heap at 100,000 policies.
func labelsFromWire(m map[string]string, name string) resource.Labels {
	if len(m) == 0 {
		return resource.Labels{}
	}
	kv := make([]string, 0, 2*len(m))
	for k, v := range m {
		if c := systemLabel(k); c != "" {
			k, v = c, systemLabelValue(v, name)
		}
		kv = append(kv, k, v)
	}
	return resource.LabelsFromPairs(kv)
}

// systemLabel is the constant equal to k when k is a label the system
// reads or writes (docs/resources.md), else "".
func systemLabel(k string) string {
	switch k {
	case resource.LabelOrigin:
		return resource.LabelOrigin
	case resource.LabelZone:
		return resource.LabelZone
	case resource.LabelDisplayName:
		return resource.LabelDisplayName
	case resource.LabelNamespace:
		return resource.LabelNamespace
	case resource.LabelPolicyRole:
		return resource.LabelPolicyRole
	case resource.LabelKDSSync:
		return resource.LabelKDSSync
	case resource.LabelMesh:
		return resource.LabelMesh
	}
	return ""
}

// systemLabelValue is v as a constant when it is one the system writes, or
// name when equal to it.
func systemLabelValue(v, name string) string {
	switch v {
	case resource.OriginGlobal:
		return resource.OriginGlobal
	case resource.OriginZone:
		return resource.OriginZone
	case resource.RoleSystem:
		return resource.RoleSystem
	case resource.RoleProducer:
		return resource.RoleProducer
	case resource.RoleConsumer:
		return resource.RoleConsumer
	case resource.RoleWorkloadOwner:
		return resource.RoleWorkloadOwner
	case name:
		return name
	}
	return v
}

func keyToWire(k resource.Key) *syncv1.ResourceKey {
	return &syncv1.ResourceKey{Type: k.Type, Mesh: k.Mesh, Name: k.Name, Namespace: k.Namespace}
}

func keyFromWire(k *syncv1.ResourceKey) resource.Key {
	return resource.Key{Type: k.GetType(), Mesh: k.GetMesh(), Name: k.GetName(), Namespace: k.GetNamespace()}
}

func wireKeyOf(w *syncv1.Resource) resource.Key {
	return resource.Key{Type: w.GetType(), Mesh: w.GetMesh(), Name: w.GetName(), Namespace: w.GetNamespace()}
}

func envToWire(env string) syncv1.Environment {
	switch env {
	case plane.EnvKubernetes:
		return syncv1.Environment_ENVIRONMENT_KUBERNETES
	case plane.EnvUniversal:
		return syncv1.Environment_ENVIRONMENT_UNIVERSAL
	}
	return syncv1.Environment_ENVIRONMENT_UNSPECIFIED
}

func envFromWire(e syncv1.Environment) (string, error) {
	switch e {
	case syncv1.Environment_ENVIRONMENT_KUBERNETES:
		return plane.EnvKubernetes, nil
	case syncv1.Environment_ENVIRONMENT_UNIVERSAL:
		return plane.EnvUniversal, nil
	}
	return "", fmt.Errorf("unknown environment %v", e)
}

// nackSummary renders a Nack's errors for logs and status, bounded so a
// batch of thousands of rejections does not make a huge string.
func nackSummary(n *syncv1.Nack) string {
	var b strings.Builder
	if e := n.GetError(); e != "" {
		b.WriteString(e)
	}
	const maxListed = 5
	for i, re := range n.GetErrors() {
		if i == maxListed {
			fmt.Fprintf(&b, "; and %d more", len(n.GetErrors())-maxListed)
			break
		}
		if b.Len() > 0 {
			b.WriteString("; ")
		}
		fmt.Fprintf(&b, "%s: %s", keyFromWire(re.GetKey()), re.GetMessage())
	}
	return b.String()
}

func msgBatch(b *syncv1.DeltaBatch) *syncv1.Message {
	return &syncv1.Message{Kind: &syncv1.Message_DeltaBatch{DeltaBatch: b}}
}

func msgAck(a *syncv1.Ack) *syncv1.Message {
	return &syncv1.Message{Kind: &syncv1.Message_Ack{Ack: a}}
}

func msgNack(n *syncv1.Nack) *syncv1.Message {
	return &syncv1.Message{Kind: &syncv1.Message_Nack{Nack: n}}
}

func msgHeartbeat(h *syncv1.Heartbeat) *syncv1.Message {
	return &syncv1.Message{Kind: &syncv1.Message_Heartbeat{Heartbeat: h}}
}
