module github.com/talkide/talkide

go 1.26.8

require github.com/golang-jwt/jwt/v5 v5.3.1

require (
	github.com/google/go-cmp v0.7.0 // indirect
	github.com/google/uuid v1.6.0 // indirect
)
