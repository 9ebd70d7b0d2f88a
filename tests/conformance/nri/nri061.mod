// The harness at NRI v0.6.1, pinned as containerd v1.7.24 ships it (nri v0.6.1, ttrpc v1.2.5,
// protobuf v1.33.0, x/sys v0.18.0). Build with: go test -c -modfile=nri061.mod -tags nri061 ./harness
module vgpud/tests/conformance/nri

go 1.21

require (
	github.com/containerd/nri v0.6.1
	github.com/containerd/ttrpc v1.2.5
	github.com/google/go-cmp v0.6.0
	google.golang.org/grpc v1.57.1
	google.golang.org/protobuf v1.33.0
)

require (
	github.com/containerd/log v0.1.0 // indirect
	github.com/gogo/protobuf v1.3.2 // indirect
	github.com/golang/protobuf v1.5.3 // indirect
	github.com/opencontainers/runtime-spec v1.0.3-0.20220825212826-86290f6a00fb // indirect
	github.com/sirupsen/logrus v1.9.3 // indirect
	golang.org/x/net v0.23.0 // indirect
	golang.org/x/sys v0.18.0 // indirect
	golang.org/x/text v0.14.0 // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20230731190214-cbb8c96f2d6d // indirect
	k8s.io/cri-api v0.25.3 // indirect
)
