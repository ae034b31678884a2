package resource

import (
	"strconv"
	"strings"
)

// Kubernetes naming rules, written as loops rather than regular expressions:
// they run on every write and on every fuzzed input.

// isDNSLabel: RFC 1123 label, lowercase alphanumerics and '-', at most 63.
func isDNSLabel(s string) bool {
	if s == "" || len(s) > 63 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		alnum := (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9')
		edge := i == 0 || i == len(s)-1
		if !alnum && (edge || c != '-') {
			return false
		}
	}
	return true
}

// isDNSSubdomain: dot-separated RFC 1123 labels, at most 253 chars.
func isDNSSubdomain(s string) bool {
	if s == "" || len(s) > 253 {
		return false
	}
	for _, label := range strings.Split(s, ".") {
		if !isDNSLabel(label) {
			return false
		}
	}
	return true
}

// isResourceName is Kubernetes' DNS-1123 subdomain rule for object names
// (docs/resources.md): at most 253 characters of lowercase alphanumerics, '-' and '.',
// each dot-separated part starting and ending with an alphanumeric, and no
// per-part length limit (unlike hostnames), so that a name plus the 17
// characters of a synced copy's hash suffix stays valid.
func isResourceName(s string) bool {
	if s == "" || len(s) > 253 {
		return false
	}
	for _, part := range strings.Split(s, ".") {
		if part == "" {
			return false
		}
		for i := 0; i < len(part); i++ {
			c := part[i]
			alnum := (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9')
			edge := i == 0 || i == len(part)-1
			if !alnum && (edge || c != '-') {
				return false
			}
		}
	}
	return true
}

// isLabelName: the name part of a qualified label key or a label value:
// alphanumerics at both ends, '-', '_' and '.' inside.
func isLabelName(s string, maxLen int) bool {
	if len(s) > maxLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		alnum := (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')
		edge := i == 0 || i == len(s)-1
		if !alnum && (edge || (c != '-' && c != '_' && c != '.')) {
			return false
		}
	}
	return true
}

// labelKeyProblem explains why key is not a Kubernetes qualified name
// ("prefix/name" or "name"), or returns "".
func labelKeyProblem(key string) string {
	prefix, name, hasPrefix := strings.Cut(key, "/")
	if !hasPrefix {
		name, prefix = prefix, ""
	}
	switch {
	case hasPrefix && !isDNSSubdomain(prefix):
		return "key prefix must be a lowercase RFC 1123 subdomain of at most 253 characters"
	case name == "" || !isLabelName(name, 63):
		return "key name must be at most 63 characters of [A-Za-z0-9_.-], starting and ending with an alphanumeric"
	}
	return ""
}

// labelValueProblem explains why value is not a valid label value, or "".
// The display name label holds a full resource name, which may be longer
// than 63 characters (names go up to 253), so it gets the name's limit.
func labelValueProblem(key, value string) string {
	maxLen := 63
	if key == LabelDisplayName {
		maxLen = 253
	}
	if !isLabelName(value, maxLen) {
		return "value must be at most " + strconv.Itoa(maxLen) + " characters of [A-Za-z0-9_.-], starting and ending with an alphanumeric"
	}
	return ""
}

// IsDNSLabel reports whether s is a lowercase RFC 1123 label (zone and mesh
// names).
func IsDNSLabel(s string) bool { return isDNSLabel(s) }
