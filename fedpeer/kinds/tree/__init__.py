"""`tree`: one exact federated CART tree."""
