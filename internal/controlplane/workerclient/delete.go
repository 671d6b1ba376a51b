package workerclient

import (
	"context"
	"net/http"

	"github.com/talkide/talkide/internal/contract"
)

// DeleteSession ends conv on the worker and removes it there (DELETE
// contract.PathStatus). A conversation the worker does not have is an
// *Error with Status 404.
func (c *Client) DeleteSession(ctx context.Context, conv string) (contract.SessionDeleted, error) {
	var out contract.SessionDeleted
	err := c.do(ctx, http.MethodDelete, path(contract.PathStatus, conv), nil, &out)
	return out, err
}
