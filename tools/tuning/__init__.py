"""`kvgate tune`: train the verifier and calibrate a route's operating point on labelled pairs."""
