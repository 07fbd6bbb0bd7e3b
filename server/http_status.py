"""HTTP status codes that Vigil uses beyond ``http.HTTPStatus``, shared by the API and its HTTP metrics."""

# nginx's "client closed request": a request whose client left before its answer; nobody receives it.
CLIENT_CLOSED_REQUEST = 499
