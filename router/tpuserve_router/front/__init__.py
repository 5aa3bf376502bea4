"""The router's fronts and their relays: the HTTP/1.1 server and its connection budget, the HTTP
port's generation routes (colocated relay, prefill/decode pairs), the endpoint picker, the
admin API, the answers the router writes itself."""
