// Command etcd is the etcd server, pinned for Meridian's HA tests and for
// running highly available by hand. It is a separate module so that the
// server's dependency graph never reaches the product's go.mod; build it with
//
//	go build -C tools/etcd -o /tmp/etcd .
//
// The flags are etcd's own (etcd --help).
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
