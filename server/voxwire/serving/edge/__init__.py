"""What guards the edge, for every transport: authentication, admission, typed API errors, request ids."""
