// Package version holds the software version, set at build time with
// -ldflags "-X github.com/meridian-mesh/meridian/internal/version.Version=...".
package version

// Version of this build.
var Version = "0.1.0-dev"
