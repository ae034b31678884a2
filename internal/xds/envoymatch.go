package xds

import (
	"regexp"

	xdscorev3 "github.com/cncf/xds/go/xds/core/v3"
	xdsmatcherv3 "github.com/cncf/xds/go/xds/type/matcher/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	matchingv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/matching/v3"
	skipv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/common/matcher/action/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	sslinputsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/matching/common_inputs/ssl/v3"

	"github.com/meridian-mesh/meridian/internal/policy"
)

// A from-rule for some clients only, on an Envoy inbound
// (docs/dataplane.md#envoy), as Kuma 2.14 renders rules by client
// identity: the filter is wrapped in an ExtensionWithMatcher that skips it
// unless the client's certificate carries the rule's identities (its URI
// SANs, spiffe://<mesh>/<service> and kuma://<tag>/<value>, the ones
// MeshTrafficPermission's RBAC matches). It needs mTLS: without client
// certificates there is no identity to match.

// forClients wraps filter so that it applies to the clients rule matches
// only; a rule for every client leaves it as it is.
func (e *envoyGen) forClients(filter *hcmv3.HttpFilter, rule policy.Rule) (*hcmv3.HttpFilter, error) {
	if len(rule.Matchers) == 0 {
		return filter, nil
	}
	skip, err := anyOf(&skipv3.SkipFilter{})
	if err != nil {
		return nil, err
	}
	input, err := anyOf(&sslinputsv3.UriSanInput{})
	if err != nil {
		return nil, err
	}
	var preds []*xdsmatcherv3.Matcher_MatcherList_Predicate
	for _, m := range rule.Matchers {
		// UriSanInput reads every URI SAN, joined by commas.
		id := regexp.QuoteMeta(policy.IdentityOf(e.in.Dataplane.Mesh, m.Key, m.Value))
		p := &xdsmatcherv3.Matcher_MatcherList_Predicate{MatchType: &xdsmatcherv3.Matcher_MatcherList_Predicate_SinglePredicate_{
			SinglePredicate: &xdsmatcherv3.Matcher_MatcherList_Predicate_SinglePredicate{
				Input: &xdscorev3.TypedExtensionConfig{Name: "envoy.matching.inputs.uri_san", TypedConfig: input},
				Matcher: &xdsmatcherv3.Matcher_MatcherList_Predicate_SinglePredicate_ValueMatch{ValueMatch: &xdsmatcherv3.StringMatcher{
					MatchPattern: &xdsmatcherv3.StringMatcher_SafeRegex{SafeRegex: &xdsmatcherv3.RegexMatcher{
						Regex: `(^|,)` + id + `(,|$)`}}}},
			}}}
		if m.Not {
			p = &xdsmatcherv3.Matcher_MatcherList_Predicate{MatchType: &xdsmatcherv3.Matcher_MatcherList_Predicate_NotMatcher{NotMatcher: p}}
		}
		preds = append(preds, p)
	}
	clients := preds[0]
	if len(preds) > 1 {
		clients = &xdsmatcherv3.Matcher_MatcherList_Predicate{MatchType: &xdsmatcherv3.Matcher_MatcherList_Predicate_AndMatcher{
			AndMatcher: &xdsmatcherv3.Matcher_MatcherList_Predicate_PredicateList{Predicate: preds}}}
	}
	others := &xdsmatcherv3.Matcher_MatcherList_Predicate{MatchType: &xdsmatcherv3.Matcher_MatcherList_Predicate_NotMatcher{NotMatcher: clients}}
	wrapped, err := anyOf(&matchingv3.ExtensionWithMatcher{
		ExtensionConfig: &corev3.TypedExtensionConfig{Name: filter.GetName(), TypedConfig: filter.GetTypedConfig()},
		XdsMatcher: &xdsmatcherv3.Matcher{MatcherType: &xdsmatcherv3.Matcher_MatcherList_{MatcherList: &xdsmatcherv3.Matcher_MatcherList{
			Matchers: []*xdsmatcherv3.Matcher_MatcherList_FieldMatcher{{
				Predicate: others,
				OnMatch: &xdsmatcherv3.Matcher_OnMatch{OnMatch: &xdsmatcherv3.Matcher_OnMatch_Action{
					Action: &xdscorev3.TypedExtensionConfig{Name: "skip", TypedConfig: skip}}},
			}},
		}}},
	})
	if err != nil {
		return nil, err
	}
	return &hcmv3.HttpFilter{Name: filter.GetName(), ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: wrapped}}, nil
}
