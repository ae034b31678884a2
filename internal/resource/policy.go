package resource

import (
	"fmt"
	"slices"
	"strings"

	"github.com/meridian-mesh/meridian/internal/condition"
)

// Validation of targetRef policy specs (docs/policy.md),
// driven by the TypeDescriptor: which arrays exist, which targetRef kinds
// each level accepts, and the conf schema of every default/override.

// Policy roles (docs/policy.md#selection), written to the kuma.io/policy-role label.
const (
	RoleSystem        = "system"
	RoleProducer      = "producer"
	RoleConsumer      = "consumer"
	RoleWorkloadOwner = "workload-owner"
)

// PolicyRole computes a policy's role (docs/policy.md#selection): a policy without a
// namespace or in the system namespace is "system"; otherwise one without
// `to` is "workload-owner", one whose every `to` item names a MeshService or
// MeshHTTPRoute in its own namespace is "producer", one where none does is
// "consumer". Mixing both is invalid and returns a *ValidationError.
// Legacy policies are cluster-wide and always "system".
func PolicyRole(r *Resource, d *TypeDescriptor, systemNamespace string) (string, error) {
	if d == nil || !d.IsPolicy() {
		return "", fmt.Errorf("policy role of %s: not a policy type", r.Key())
	}
	if d.Shape != ShapeTargetRef || isSystemNamespace(r.Namespace, systemNamespace) {
		return RoleSystem, nil
	}
	spec, err := decodeSpecObject(r.Spec)
	if err != nil {
		return "", fmt.Errorf("policy role of %s: %w", r.Key(), err)
	}
	role, ok := roleOf(spec, r.Namespace)
	if !ok {
		verr := &ValidationError{}
		verr.Add("spec.to", "%s", mixedRoleMessage(r.Namespace))
		return "", verr
	}
	return role, nil
}

func mixedRoleMessage(ns string) string {
	return fmt.Sprintf("must not mix targets in the policy's namespace %q with targets in other namespaces", ns)
}

// roleOf returns the role of a policy in the custom namespace ns; ok is
// false when its `to` items mix producer and consumer targets.
func roleOf(spec map[string]any, ns string) (role string, ok bool) {
	to, _ := spec["to"].([]any)
	if len(to) == 0 {
		return RoleWorkloadOwner, true
	}
	producer := 0
	for _, item := range to {
		entry, _ := item.(map[string]any)
		ref, _ := entry["targetRef"].(map[string]any)
		if isOwnNamespaceRef(ref, ns) {
			producer++
		}
	}
	switch producer {
	case len(to):
		return RoleProducer, true
	case 0:
		return RoleConsumer, true
	default:
		return "", false
	}
}

// isOwnNamespaceRef: a reference to a MeshService or MeshHTTPRoute in the
// policy's namespace. An empty namespace means the policy's own;
// a labels reference is own only when it names that namespace.
func isOwnNamespaceRef(ref map[string]any, ns string) bool {
	kind, _ := ref["kind"].(string)
	if kind != KindMeshService && kind != KindMeshHTTPRoute {
		return false
	}
	if labels, ok := ref["labels"].(map[string]any); ok && ref["name"] == nil {
		return labels[LabelNamespace] == ns
	}
	refNS, _ := ref["namespace"].(string)
	return refNS == "" || refNS == ns
}

func isSystemNamespace(ns, systemNamespace string) bool {
	return ns == "" || ns == systemNamespace
}

// confBlockKeys are the defaults-and-overrides keys of an entry (or a proxy-wide spec).
func confBlockKeys() []string { return []string{"default", "override", "strategy", "when", "unset"} }

// validateTargetRefPolicy checks a targetRef policy's spec.
func validateTargetRefPolicy(cond *condition.Env, d *TypeDescriptor, r *Resource, spec map[string]any, sysNS string, errs *ValidationError) {
	checkPolicyKeys(d, spec, errs)
	if ref := spec["targetRef"]; ref != nil {
		validateTargetRef("spec.targetRef", ref, d.TopLevelKinds, errs)
	}
	if d.To {
		forEachEntry("spec.to", spec["to"], errs, func(p string, e map[string]any) { validateToEntry(cond, d, p, e, errs) })
	}
	if d.From {
		forEachEntry("spec.from", spec["from"], errs, func(p string, e map[string]any) { validateFromEntry(cond, d, p, e, errs) })
	}
	if d.ProxyWide {
		validateConfBlocks(cond, d, "spec", spec, errs)
	}
	if d.InboundRules {
		validateInboundRules(d, spec, errs)
	}
	checkSectionName(spec, errs)
	if d.ToOnlyForGateways && isNonEmpty(spec["to"]) && !includesGateways(spec) {
		errs.Add("spec.to", "must not be defined: %s to applies to gateways only (a top-level MeshGateway, or Mesh/MeshSubset including Gateway proxies)", d.Name)
	}
	requireContent(d, spec, errs)
	if d.Rules {
		checkRouteTargets(spec, errs)
	}
	if !isSystemNamespace(r.Namespace, sysNS) {
		checkNamespacedPolicy(d, r.Namespace, spec, errs)
	}
}

// checkPolicyKeys reports unknown top-level keys, naming the ones that exist
// on other policy types so the message says what is wrong.
func checkPolicyKeys(d *TypeDescriptor, spec map[string]any, errs *ValidationError) {
	clean := true
	for k := range spec {
		if ok, _ := policyKey(d, k); !ok {
			clean = false
			break
		}
	}
	if clean {
		return // the usual case: no sort, no allocation (a zone validates every policy it receives)
	}
	for _, k := range sortedKeys(spec) {
		ok, known := policyKey(d, k)
		switch {
		case !known:
			errs.Add(joinPath("spec", k), "unknown field")
		case !ok:
			errs.Add(joinPath("spec", k), "%s does not support %s", d.Name, k)
		}
	}
}

// policyKey reports whether k is a key of targetRef policy specs (known)
// and whether policies of type d may carry it (ok).
func policyKey(d *TypeDescriptor, k string) (ok, known bool) {
	switch k {
	case "targetRef":
		return true, true
	case "to":
		return d.To, true
	case "from":
		return d.From, true
	case "rules":
		return d.InboundRules, true
	}
	if contains(confBlockKeys(), k) {
		return d.ProxyWide, true
	}
	return false, false
}

// forEachEntry walks a to/from list, reporting entries that are not objects.
func forEachEntry(path string, v any, errs *ValidationError, fn func(string, map[string]any)) {
	if v == nil {
		return
	}
	list, ok := v.([]any)
	if !ok {
		errs.Add(path, "must be a list, got %s", jsonType(v))
		return
	}
	for i, item := range list {
		p := indexPath(path, i)
		obj, ok := item.(map[string]any)
		if !ok {
			errs.Add(p, "must be an object, got %s", jsonType(item))
			continue
		}
		fn(p, obj)
	}
}

func validateToEntry(cond *condition.Env, d *TypeDescriptor, path string, e map[string]any, errs *ValidationError) {
	if e["targetRef"] == nil {
		errs.Add(path+".targetRef", "must be set")
	} else {
		validateTargetRef(path+".targetRef", e["targetRef"], d.ToKinds, errs)
	}
	if d.Rules {
		validateRouteEntry(d, path, e, errs)
		return
	}
	checkEntryKeys(path, e, errs, append(confBlockKeys(), "targetRef"))
	validateConfBlocks(cond, d, path, e, errs)
}

func validateFromEntry(cond *condition.Env, d *TypeDescriptor, path string, e map[string]any, errs *ValidationError) {
	// A missing from[].targetRef means Mesh.
	if ref := e["targetRef"]; ref != nil {
		validateTargetRef(path+".targetRef", ref, d.FromKinds, errs)
	}
	checkEntryKeys(path, e, errs, append(confBlockKeys(), "targetRef"))
	validateConfBlocks(cond, d, path, e, errs)
}

// validateInboundRules checks spec.rules (Kuma 2.10+ inbound policies): each
// item's default applies to all inbound traffic of the selected proxies; a
// policy with rules has no to or from (Kuma refuses the mix).
func validateInboundRules(d *TypeDescriptor, spec map[string]any, errs *ValidationError) {
	if !isNonEmpty(spec["rules"]) {
		return
	}
	switch {
	case d.To && (isNonEmpty(spec["to"]) || isNonEmpty(spec["from"])):
		errs.Add("spec", "fields 'to' and 'from' must be empty when 'rules' is defined")
	case isNonEmpty(spec["from"]):
		errs.Add("spec", "field 'from' must be empty when 'rules' is defined")
	}
	if k := topLevelKind(spec); k == KindMeshGateway || k == KindMeshHTTPRoute {
		errs.Add("spec.rules", "must not be defined with a top-level %s: rules apply to inbound traffic", k)
	}
	conf := d.Conf
	if d.RuleConf != nil {
		conf = d.RuleConf
	}
	forEachEntry("spec.rules", spec["rules"], errs, func(path string, e map[string]any) {
		checkEntryKeys(path, e, errs, []string{"default", "matches"})
		if e["matches"] != nil {
			if d.RuleConf != nil {
				errs.Add(path+".matches", "must not be set: %s rules match clients in their default", d.Name)
			} else {
				listOf(spiffeIDMatch()).validate(path+".matches", e["matches"], errs)
			}
		}
		if e["default"] == nil {
			errs.Add(path+".default", "must be set")
		} else if conf != nil {
			conf.validate(path+".default", e["default"], errs)
		}
	})
}

// checkSectionName: sectionName on a top-level Dataplane narrows a policy
// to one inbound or listener; Kuma allows it only on policies that affect
// inbounds (spec.from or spec.rules).
func checkSectionName(spec map[string]any, errs *ValidationError) {
	ref, _ := spec["targetRef"].(map[string]any)
	if ref["kind"] == KindDataplane && ref["sectionName"] != nil && !isNonEmpty(spec["rules"]) && !isNonEmpty(spec["from"]) {
		errs.Add("spec.targetRef.sectionName", "can only be used with inbound policies (spec.from or spec.rules)")
	}
}

// includesGateways: the top-level targetRef may select gateway proxies
// (Kuma's IncludesGateways).
func includesGateways(spec map[string]any) bool {
	ref, _ := spec["targetRef"].(map[string]any)
	switch kind, _ := ref["kind"].(string); kind {
	case "", KindMesh, KindMeshSubset:
		types, _ := ref["proxyTypes"].([]any)
		return len(types) == 0 || slices.Contains(types, any("Gateway"))
	case KindMeshGateway, KindMeshHTTPRoute:
		return true
	}
	return false
}

// validateRouteEntry: a route's to[] item carries rules, each validated by
// the descriptor's Conf (one rule), and optional gateway hostnames.
func validateRouteEntry(d *TypeDescriptor, path string, e map[string]any, errs *ValidationError) {
	checkEntryKeys(path, e, errs, []string{"targetRef", "rules", "hostnames"})
	if h := e["hostnames"]; h != nil {
		listOf(str().with(stringCheck(checkGatewayHostname))).validate(path+".hostnames", h, errs)
	}
	if e["rules"] == nil {
		if !d.OneRule {
			errs.Add(path+".rules", "must be set")
		}
		return
	}
	rules := nonEmptyList(d.Conf)
	if d.OneRule {
		rules = listOf(d.Conf).with(atMostOne)
	}
	rules.validate(path+".rules", e["rules"], errs)
}

// atMostOne: a list of at most one item (Kuma's MaxItems=1).
func atMostOne(path string, v any, errs *ValidationError) {
	if len(v.([]any)) > 1 {
		errs.Add(path, "must have at most one item")
	}
}

// checkGatewayHostname allows a leading wildcard label, as listeners do.
func checkGatewayHostname(s string) string {
	if s == "*" {
		return ""
	}
	return checkHostname(strings.TrimPrefix(s, "*."))
}

func checkEntryKeys(path string, e map[string]any, errs *ValidationError, allowed []string) {
	for k := range e {
		if !contains(allowed, k) {
			// Report in key order; only a refused entry pays the sort.
			for _, k := range sortedKeys(e) {
				if !contains(allowed, k) {
					errs.Add(joinPath(path, k), "unknown field")
				}
			}
			return
		}
	}
}

// validateConfBlocks checks default/override against the conf schema and
// the defaults-and-overrides qualifiers strategy, when and unset (docs/policy.md#defaults-and-overrides). Every
// qualifier must have something to act on: a strategy or when for a block
// that is absent would be accepted and never honoured, so it is refused.
func validateConfBlocks(cond *condition.Env, d *TypeDescriptor, path string, obj map[string]any, errs *ValidationError) {
	for _, block := range []string{"default", "override"} {
		if v := obj[block]; v != nil && d.Conf != nil {
			d.Conf.validate(path+"."+block, v, errs)
		}
	}
	if v := obj["strategy"]; v != nil {
		strategy := func() *Schema { return enum("merge", "atomic") }
		object(opt("default", strategy()), opt("override", strategy())).validate(path+".strategy", v, errs)
		requireBlocks(path+".strategy", v, obj, errs)
	}
	if v := obj["when"]; v != nil {
		object(opt("default", nonEmptyStr()), opt("override", nonEmptyStr())).validate(path+".when", v, errs)
		requireBlocks(path+".when", v, obj, errs)
		compileWhen(cond, path+".when", v, errs)
	}
	if v := obj["unset"]; v != nil {
		listOf(nonEmptyStr().with(confPathExists(d.Conf))).validate(path+".unset", v, errs)
	}
}

// requireBlocks: strategy.X and when.X need the block X.
func requireBlocks(path string, v any, obj map[string]any, errs *ValidationError) {
	q, _ := v.(map[string]any)
	for _, block := range []string{"default", "override"} {
		if _, set := q[block]; set && obj[block] == nil {
			errs.Add(joinPath(path, block), "is set but there is no %s block to apply it to", block)
		}
	}
}

// compileWhen compiles each `when` expression with the engine's CEL
// environment: it must parse, be boolean and have a bounded cost.
func compileWhen(cond *condition.Env, path string, v any, errs *ValidationError) {
	q, _ := v.(map[string]any)
	for _, block := range []string{"default", "override"} {
		src, ok := q[block].(string)
		if !ok || src == "" || cond == nil {
			continue
		}
		if _, err := cond.Compile(src); err != nil {
			errs.Add(joinPath(path, block), "%v", err)
		}
	}
}

// confPathExists checks an unset path against the conf schema.
func confPathExists(conf *Schema) checkFunc {
	return func(path string, v any, errs *ValidationError) {
		p := v.(string)
		if p != "" && (conf == nil || !conf.HasPath(p)) {
			errs.Add(path, "unknown field path %q", p)
		}
	}
}

// requireContent: a policy must say something (Kuma: "at least one of
// 'from', 'to' has to be defined"; proxy-wide policies need a conf).
func requireContent(d *TypeDescriptor, spec map[string]any, errs *ValidationError) {
	var want []string
	has := false
	add := func(enabled bool, keys ...string) {
		if !enabled {
			return
		}
		for _, k := range keys {
			want = append(want, k)
			has = has || isNonEmpty(spec[k])
		}
	}
	add(d.To, "to")
	add(d.From, "from")
	add(d.InboundRules, "rules")
	add(d.ProxyWide, "default", "override")
	switch {
	case has || len(want) == 0:
	case len(want) == 1:
		errs.Add("spec."+want[0], "must be set")
	default:
		errs.Add("spec", "at least one of %s must be defined", strings.Join(want, ", "))
	}
}

func isNonEmpty(v any) bool {
	if list, ok := v.([]any); ok {
		return len(list) > 0
	}
	return v != nil
}

// checkRouteTargets: a route targets all outbounds (to kind Mesh) only on a
// gateway, where there is no single destination service.
func checkRouteTargets(spec map[string]any, errs *ValidationError) {
	if topLevelKind(spec) == KindMeshGateway {
		return
	}
	to, _ := spec["to"].([]any)
	for i, item := range to {
		if refKind(item) == KindMesh {
			errs.Add(indexPath("spec.to", i)+".targetRef.kind", "Mesh is only allowed when the top-level targetRef is a MeshGateway")
		}
	}
}

// checkNamespacedPolicy enforces the namespace rules for policies in a custom
// namespace, and docs/policy.md#defaults-and-overrides (no override outside system/producer policies).
func checkNamespacedPolicy(d *TypeDescriptor, ns string, spec map[string]any, errs *ValidationError) {
	if isNonEmpty(spec["to"]) && isNonEmpty(spec["from"]) {
		errs.Add("spec", "a policy in namespace %q must not define both from and to", ns)
	}
	role, ok := roleOf(spec, ns)
	if !ok {
		errs.Add("spec.to", "%s", mixedRoleMessage(ns))
		return
	}
	if role == RoleConsumer || role == RoleWorkloadOwner {
		forbidOverrides(role, spec, errs)
	}
	if role == RoleConsumer && topLevelKind(spec) == KindMeshGateway {
		errs.Add("spec.targetRef.kind", "a consumer policy must not target a MeshGateway: MeshGateway is cluster-scoped")
	}
	if d.Rules && topLevelKind(spec) == KindMeshGateway {
		checkBackendNamespaces(ns, spec, errs)
	}
}

func forbidOverrides(role string, spec map[string]any, errs *ValidationError) {
	msg := "a " + role + " policy must not define override: only system and producer policies may"
	if spec["override"] != nil {
		errs.Add("spec.override", "%s", msg)
	}
	for _, list := range []string{"to", "from"} {
		items, _ := spec[list].([]any)
		for i, item := range items {
			if e, ok := item.(map[string]any); ok && e["override"] != nil {
				errs.Add(indexPath("spec."+list, i)+".override", "%s", msg)
			}
		}
	}
}

// checkBackendNamespaces: a gateway route in a custom namespace may only
// send traffic to its own namespace (cross-namespace forwarding).
func checkBackendNamespaces(ns string, spec map[string]any, errs *ValidationError) {
	to, _ := spec["to"].([]any)
	for i, item := range to {
		e, _ := item.(map[string]any)
		rules, _ := e["rules"].([]any)
		for j, rule := range rules {
			r, _ := rule.(map[string]any)
			def, _ := r["default"].(map[string]any)
			refs, _ := def["backendRefs"].([]any)
			for k, ref := range refs {
				m, _ := ref.(map[string]any)
				if refNS, _ := m["namespace"].(string); refNS != "" && refNS != ns {
					p := fmt.Sprintf("spec.to[%d].rules[%d].default.backendRefs[%d].namespace", i, j, k)
					errs.Add(p, "a gateway route in namespace %q must not send traffic to namespace %q", ns, refNS)
				}
			}
		}
	}
}

func topLevelKind(spec map[string]any) string {
	ref, _ := spec["targetRef"].(map[string]any)
	kind, _ := ref["kind"].(string)
	return kind
}

func refKind(entry any) string {
	e, _ := entry.(map[string]any)
	ref, _ := e["targetRef"].(map[string]any)
	kind, _ := ref["kind"].(string)
	return kind
}

// kindRule says which targetRef fields a kind needs and forbids (docs/policy.md#selection).
type kindRule struct {
	required     []string
	forbidden    []string
	nameOrLabels bool // exactly one of name, labels (references by labels)
	labelsOrName bool // at most one of labels, name+namespace
}

func kindRules(kind string) kindRule {
	switch kind {
	case KindMesh:
		return kindRule{forbidden: []string{"name", "namespace", "labels", "tags", "sectionName"}}
	case KindMeshSubset:
		// Tags may be left out: MeshSubset with only proxyTypes (Kuma).
		return kindRule{forbidden: []string{"name", "namespace", "labels", "sectionName"}}
	case KindDataplane:
		// Every Dataplane, one by name (and namespace), or those with
		// labels; sectionName picks one inbound or listener.
		return kindRule{forbidden: []string{"tags", "mesh", "proxyTypes"}, labelsOrName: true}
	case KindMeshServiceSubset:
		return kindRule{required: []string{"name", "tags"}, forbidden: []string{"labels", "sectionName"}}
	case KindMeshGateway:
		return kindRule{required: []string{"name"}, forbidden: []string{"labels", "namespace", "sectionName"}}
	case KindMeshHTTPRoute, KindMeshExternalService:
		// One resource without sections (ports): Kuma refuses sectionName.
		return kindRule{forbidden: []string{"tags", "sectionName"}, nameOrLabels: true}
	default: // MeshService, MeshMultiZoneService: sectionName names a port
		return kindRule{forbidden: []string{"tags"}, nameOrLabels: true}
	}
}

// targetRefShape is built once: validation runs on every write, and a schema
// is never changed after construction.
var targetRefShape = targetRefSchema()

func targetRefSchema() *Schema {
	return object(
		req("kind", nonEmptyStr()),
		opt("name", nonEmptyStr()),
		opt("namespace", str().with(stringCheck(checkRefNamespace))),
		opt("labels", stringMap()),
		opt("tags", tagMap()),
		opt("mesh", nonEmptyStr()),
		opt("sectionName", nonEmptyStr()),
		opt("proxyTypes", listOf(enum("Sidecar", "Gateway"))),
	)
}

func checkRefNamespace(s string) string {
	if s != "" && !isDNSLabel(s) {
		return fmt.Sprintf("invalid namespace %q: must be a lowercase RFC 1123 label", s)
	}
	return ""
}

// validateTargetRef checks a targetRef's shape, that its kind is allowed at
// this level, and the fields that kind requires or forbids.
func validateTargetRef(path string, v any, kinds []string, errs *ValidationError) {
	targetRefShape.validate(path, v, errs)
	ref, ok := v.(map[string]any)
	if !ok {
		return
	}
	kind, _ := ref["kind"].(string)
	if kind == "" {
		return
	}
	if !contains(kinds, kind) {
		errs.Add(path+".kind", "invalid value %q: must be one of %s", kind, strings.Join(kinds, ", "))
		return
	}
	rule := kindRules(kind)
	for _, f := range rule.required {
		if ref[f] == nil {
			errs.Add(joinPath(path, f), "must be set with kind %s", kind)
		}
	}
	for _, f := range rule.forbidden {
		if ref[f] != nil {
			errs.Add(joinPath(path, f), "must not be set with kind %s", kind)
		}
	}
	if rule.nameOrLabels {
		checkNameOrLabels(path, kind, ref, errs)
	}
	if rule.labelsOrName && ref["labels"] != nil && (ref["name"] != nil || ref["namespace"] != nil) {
		errs.Add(path+".labels", "either labels or name and namespace must be specified")
	}
}

func checkNameOrLabels(path, kind string, ref map[string]any, errs *ValidationError) {
	switch {
	case ref["name"] == nil && ref["labels"] == nil:
		errs.Add(path+".name", "must be set with kind %s (or use labels)", kind)
	case ref["name"] != nil && ref["labels"] != nil:
		errs.Add(path+".labels", "must not be set together with name")
	case ref["labels"] != nil && ref["namespace"] != nil:
		errs.Add(path+".namespace", "must not be set together with labels")
	}
}
