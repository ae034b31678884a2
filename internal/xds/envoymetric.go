package xds

import (
	"encoding/json"
	"net/url"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/types/known/durationpb"
)

// EnvoyAdminPort is where an Envoy sidecar's admin listens (loopback), as
// in Kuma; meridian-dp's bootstrap sets it.
const EnvoyAdminPort = 9901

// MeshMetric for Envoy (docs/dataplane.md#envoy): each Prometheus backend
// is a listener on the Dataplane's address and the backend's port, named
// as Kuma names it, whose path serves Envoy's own Prometheus statistics
// (the admin's /stats/prometheus; sidecar.includeUnused and sidecar.regex
// become its usedonly and filter). Kuma's agent merges the applications'
// metrics into the same page and pushes OpenTelemetry; meridian-dp does
// neither, so applications, profiles and OpenTelemetry backends are named
// as not rendered.

type meshMetricConf struct {
	Sidecar *struct {
		Regex         *string         `json:"regex"`
		IncludeUnused *bool           `json:"includeUnused"`
		Profiles      json.RawMessage `json:"profiles"`
	} `json:"sidecar"`
	Applications []json.RawMessage `json:"applications"`
	Backends     []struct {
		Type       string `json:"type"`
		Prometheus *struct {
			ClientID *string `json:"clientId"`
			Port     int     `json:"port"`
			Path     string  `json:"path"`
			TLS      *struct {
				Mode string `json:"mode"`
			} `json:"tls"`
		} `json:"prometheus"`
	} `json:"backends"`
}

// metrics renders MeshMetric's Prometheus listeners.
func (e *envoyGen) metrics() error {
	ap, ok := e.in.Config.Proxy["MeshMetric"]
	if !ok || ap.Conf == nil {
		return nil
	}
	var c meshMetricConf
	e.about = ap.Origin
	defer func() { e.about = nil }()
	if err := json.Unmarshal(ap.Conf, &c); err != nil {
		e.drop("MeshMetric (whole proxy): conf cannot be read: %v", err)
		return nil
	}
	if len(c.Applications) > 0 {
		e.drop("MeshMetric applications (whole proxy): not rendered for Envoy (application metrics are not merged by meridian-dp)")
	}
	query := "?usedonly"
	if s := c.Sidecar; s != nil {
		if len(s.Profiles) > 0 && string(s.Profiles) != "null" {
			e.drop("MeshMetric sidecar.profiles (whole proxy): not rendered for Envoy")
		}
		if s.IncludeUnused != nil && *s.IncludeUnused {
			query = ""
		}
		if s.Regex != nil && *s.Regex != "" {
			if query == "" {
				query = "?filter=" + url.QueryEscape(*s.Regex)
			} else {
				query += "&filter=" + url.QueryEscape(*s.Regex)
			}
		}
	}
	for i, b := range c.Backends {
		p := b.Prometheus
		if b.Type != "Prometheus" || p == nil {
			e.drop("MeshMetric backends[%d] (%s) (whole proxy): not rendered for Envoy (meridian-dp pushes no metrics)", i, b.Type)
			continue
		}
		if p.TLS != nil && p.TLS.Mode != "" && p.TLS.Mode != "Disabled" {
			e.drop("MeshMetric backends[%d].prometheus.tls.mode %s (whole proxy): not rendered for Envoy; the listener serves plain HTTP", i, p.TLS.Mode)
		}
		if err := e.prometheusListener(p.ClientID, p.Port, p.Path, query); err != nil {
			return err
		}
	}
	return nil
}

func (e *envoyGen) prometheusListener(clientID *string, port int, path, query string) error {
	id := "default-backend"
	if clientID != nil && *clientID != "" {
		id = cleanName(*clientID)
	}
	if path == "" {
		path = "/metrics"
	}
	if port == 0 {
		port = 5670
	}
	name := "system_meshmetric_prometheus_" + id
	hcm, err := typed("envoy.filters.network.http_connection_manager", &hcmv3.HttpConnectionManager{
		StatPrefix: name,
		RouteSpecifier: &hcmv3.HttpConnectionManager_RouteConfig{RouteConfig: &routev3.RouteConfiguration{
			VirtualHosts: []*routev3.VirtualHost{{Name: name, Domains: []string{"*"}, Routes: []*routev3.Route{{
				Match: &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: path}},
				Action: &routev3.Route_Route{Route: &routev3.RouteAction{ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: name},
					PrefixRewrite: "/stats/prometheus" + query}},
			}}}},
		}},
		HttpFilters: []*hcmv3.HttpFilter{e.routerFilter()},
	})
	if err != nil {
		return err
	}
	e.out.Listeners = append(e.out.Listeners, &listenerv3.Listener{
		Name: name, Address: socketAddress(e.in.Dataplane.Address, port), TrafficDirection: corev3.TrafficDirection_INBOUND,
		FilterChains: []*listenerv3.FilterChain{{Filters: []*listenerv3.Filter{hcm}}},
	})
	e.shape(resourcev3.ListenerType, name, e.carry(e.about))
	e.collectors[name] = &clusterv3.Cluster{
		Name: name, ConnectTimeout: durationpb.New(defaultConnectTimeout), ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_STATIC},
		LoadAssignment: &endpointv3.ClusterLoadAssignment{ClusterName: name, Endpoints: []*endpointv3.LocalityLbEndpoints{{
			LbEndpoints: []*endpointv3.LbEndpoint{{HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{
				Address: socketAddress("127.0.0.1", EnvoyAdminPort)}}}}}}},
	}
	e.collectorShapers[name] = append(e.collectorShapers[name], e.about)
	return nil
}
