module github.com/ferrymq/ferry/protocodec

go 1.26.0

replace github.com/ferrymq/ferry => ../

require (
	github.com/ferrymq/ferry v0.0.0-00010101000000-000000000000
	github.com/stretchr/testify v1.12.1
	go.uber.org/goleak v1.3.0
	google.golang.org/protobuf v1.36.12
)

require go.yaml.in/yaml/v3 v3.0.5 // indirect
