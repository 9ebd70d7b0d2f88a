module vgpud/tests/conformance/nri/samples

go 1.24.0

// containerd/nri's sample plugin ulimit-adjuster at v0.4.0: the newest release whose root module holds
// a sample plugin (README.md next to this directory says why)
tool github.com/containerd/nri/plugins/ulimit-adjuster

require (
	github.com/containerd/containerd v1.6.9 // indirect
	github.com/containerd/nri v0.4.0 // indirect
	github.com/containerd/ttrpc v1.1.1-0.20220420014843-944ef4a40df3 // indirect
	github.com/gogo/protobuf v1.3.2 // indirect
	github.com/golang/protobuf v1.5.2 // indirect
	github.com/opencontainers/runtime-spec v1.0.3-0.20220825212826-86290f6a00fb // indirect
	github.com/sirupsen/logrus v1.8.1 // indirect
	golang.org/x/net v0.1.0 // indirect
	golang.org/x/sys v0.1.0 // indirect
	golang.org/x/text v0.4.0 // indirect
	google.golang.org/genproto v0.0.0-20220502173005-c8bf987b8c21 // indirect
	google.golang.org/grpc v1.47.0 // indirect
	google.golang.org/protobuf v1.28.1 // indirect
	gopkg.in/yaml.v2 v2.4.0 // indirect
	k8s.io/cri-api v0.25.3 // indirect
	sigs.k8s.io/yaml v1.3.0 // indirect
)
