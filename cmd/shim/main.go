package main
import (_ "github.com/containerd/cgroups/v3/cgroup2"; _ "github.com/containerd/cgroups/v3/cgroup1"; _ "github.com/vishvananda/netlink"; _ "github.com/vishvananda/netns"; _ "github.com/hashicorp/go-hclog"; _ "golang.org/x/sys/unix")
func main(){}
