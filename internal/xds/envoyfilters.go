package xds

import (
	"encoding/json"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/meridian-mesh/meridian/internal/resource"
)

// MeshHTTPRoute filters for Envoy (docs/dataplane.md#envoy), as Kuma
// renders them on a rule's routes: header modifiers, a redirect instead of
// the route's action, URL rewrites (host, full path, prefix) and request
// mirrors to a backend's cluster.

type headerModifier struct {
	Set    []struct{ Name, Value string } `json:"set"`
	Add    []struct{ Name, Value string } `json:"add"`
	Remove []string                       `json:"remove"`
}

type pathRewrite struct {
	Type               string  `json:"type"`
	ReplaceFullPath    *string `json:"replaceFullPath"`
	ReplacePrefixMatch *string `json:"replacePrefixMatch"`
}

type routeFilter struct {
	Type                   string          `json:"type"`
	RequestHeaderModifier  *headerModifier `json:"requestHeaderModifier"`
	ResponseHeaderModifier *headerModifier `json:"responseHeaderModifier"`
	RequestRedirect        *struct {
		Scheme     *string      `json:"scheme"`
		Hostname   *string      `json:"hostname"`
		Path       *pathRewrite `json:"path"`
		Port       *uint32      `json:"port"`
		StatusCode *int         `json:"statusCode"`
	} `json:"requestRedirect"`
	URLRewrite *struct {
		Hostname              *string      `json:"hostname"`
		Path                  *pathRewrite `json:"path"`
		HostToBackendHostname bool         `json:"hostToBackendHostname"`
	} `json:"urlRewrite"`
	RequestMirror *struct {
		Percentage any `json:"percentage"`
		BackendRef struct {
			Kind string            `json:"kind"`
			Name string            `json:"name"`
			Tags map[string]string `json:"tags"`
		} `json:"backendRef"`
	} `json:"requestMirror"`
}

// ruleFilters are what a rule's filters give each of its routes.
type ruleFilters struct {
	reqAdd, respAdd       []*corev3.HeaderValueOption
	reqRemove, respRemove []string
	redirect              *routeFilter
	rewrite               *routeFilter
	mirrors               []*routev3.RouteAction_RequestMirrorPolicy
}

func (e *envoyGen) routeFilters(svc string, i int, rule httpRule) ruleFilters {
	var rf ruleFilters
	for j, raw := range rule.Default.Filters {
		var f routeFilter
		b, _ := json.Marshal(raw)
		if json.Unmarshal(b, &f) != nil {
			e.drop("MeshHTTPRoute rules[%d].default.filters[%d] of %s: cannot be read", i, j, svc)
			continue
		}
		switch {
		case f.Type == "RequestHeaderModifier" && f.RequestHeaderModifier != nil:
			rf.reqAdd, rf.reqRemove = appendHeaders(rf.reqAdd, rf.reqRemove, f.RequestHeaderModifier)
		case f.Type == "ResponseHeaderModifier" && f.ResponseHeaderModifier != nil:
			rf.respAdd, rf.respRemove = appendHeaders(rf.respAdd, rf.respRemove, f.ResponseHeaderModifier)
		case f.Type == "RequestRedirect" && f.RequestRedirect != nil:
			rf.redirect = &f
		case f.Type == "URLRewrite" && f.URLRewrite != nil:
			rf.rewrite = &f
		case f.Type == "RequestMirror" && f.RequestMirror != nil:
			ref := f.RequestMirror.BackendRef
			if ref.Kind != resource.KindMeshService && ref.Kind != resource.KindMeshServiceSubset {
				e.drop("MeshHTTPRoute rules[%d].default.filters[%d] (RequestMirror) of %s: kind %s has no endpoints the zone serves", i, j, svc, ref.Kind)
				continue
			}
			mp := &routev3.RouteAction_RequestMirrorPolicy{Cluster: e.cluster(ref.Name, ref.Tags)}
			if v, ok := number(f.RequestMirror.Percentage); ok {
				mp.RuntimeFraction = &corev3.RuntimeFractionalPercent{DefaultValue: millionths(v)}
			}
			rf.mirrors = append(rf.mirrors, mp)
		default:
			e.drop("MeshHTTPRoute rules[%d].default.filters[%d] (%s) of %s: cannot be read", i, j, f.Type, svc)
		}
	}
	return rf
}

// millionths is a percentage as Envoy's fraction of a million.
func millionths(pct float64) *typev3.FractionalPercent {
	return &typev3.FractionalPercent{Numerator: uint32(pct * 10000), Denominator: typev3.FractionalPercent_MILLION}
}

func appendHeaders(add []*corev3.HeaderValueOption, remove []string, m *headerModifier) ([]*corev3.HeaderValueOption, []string) {
	for _, h := range m.Set {
		add = append(add, &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: h.Name, Value: h.Value},
			AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD})
	}
	for _, h := range m.Add {
		add = append(add, &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: h.Name, Value: h.Value},
			AppendAction: corev3.HeaderValueOption_APPEND_IF_EXISTS_OR_ADD})
	}
	return add, append(remove, m.Remove...)
}

// redirectCodes are Envoy's redirect response codes by HTTP status.
var redirectCodes = map[int]routev3.RedirectAction_RedirectResponseCode{
	301: routev3.RedirectAction_MOVED_PERMANENTLY, 302: routev3.RedirectAction_FOUND, 303: routev3.RedirectAction_SEE_OTHER,
	307: routev3.RedirectAction_TEMPORARY_REDIRECT, 308: routev3.RedirectAction_PERMANENT_REDIRECT,
}

// apply gives route r (of a match on path) the rule's filters.
func (rf ruleFilters) apply(r *routev3.Route, path *struct {
	Type  string `json:"type"`
	Value string `json:"value"`
}) {
	r.RequestHeadersToAdd, r.RequestHeadersToRemove = rf.reqAdd, rf.reqRemove
	r.ResponseHeadersToAdd, r.ResponseHeadersToRemove = rf.respAdd, rf.respRemove
	if f := rf.redirect; f != nil {
		rr := f.RequestRedirect
		ra := &routev3.RedirectAction{}
		if rr.Scheme != nil {
			ra.SchemeRewriteSpecifier = &routev3.RedirectAction_SchemeRedirect{SchemeRedirect: *rr.Scheme}
		}
		if rr.Hostname != nil {
			ra.HostRedirect = *rr.Hostname
		}
		if rr.Port != nil {
			ra.PortRedirect = *rr.Port
		}
		if p := rr.Path; p != nil {
			switch {
			case p.ReplaceFullPath != nil:
				ra.PathRewriteSpecifier = &routev3.RedirectAction_PathRedirect{PathRedirect: *p.ReplaceFullPath}
			case p.ReplacePrefixMatch != nil:
				ra.PathRewriteSpecifier = &routev3.RedirectAction_PrefixRewrite{PrefixRewrite: *p.ReplacePrefixMatch}
			}
		}
		code := 302
		if rr.StatusCode != nil {
			code = *rr.StatusCode
		}
		ra.ResponseCode = redirectCodes[code]
		r.Action = &routev3.Route_Redirect{Redirect: ra}
		return
	}
	a := r.GetRoute()
	if a == nil {
		return
	}
	if f := rf.rewrite; f != nil {
		rw := f.URLRewrite
		if rw.Hostname != nil {
			a.HostRewriteSpecifier = &routev3.RouteAction_HostRewriteLiteral{HostRewriteLiteral: *rw.Hostname}
		}
		if rw.HostToBackendHostname {
			a.HostRewriteSpecifier = &routev3.RouteAction_AutoHostRewrite{AutoHostRewrite: wrapperspb.Bool(true)}
		}
		if p := rw.Path; p != nil {
			switch {
			case p.ReplaceFullPath != nil:
				a.RegexRewrite = &matcherv3.RegexMatchAndSubstitute{Pattern: &matcherv3.RegexMatcher{Regex: `.*`}, Substitution: *p.ReplaceFullPath}
			case p.ReplacePrefixMatch != nil:
				a.PrefixRewrite = *p.ReplacePrefixMatch
				// As Kuma: rewriting the prefix "/" keeps the rest of the
				// path without a doubled slash.
				if path != nil && path.Type == "PathPrefix" && strings.TrimSuffix(path.Value, "/") == "" {
					a.PrefixRewrite = ""
					a.RegexRewrite = &matcherv3.RegexMatchAndSubstitute{Pattern: &matcherv3.RegexMatcher{Regex: `^/(.*)`},
						Substitution: strings.TrimSuffix(*p.ReplacePrefixMatch, "/") + `/\1`}
				}
			}
		}
	}
	a.RequestMirrorPolicies = rf.mirrors
}
