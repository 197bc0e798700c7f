"""``meshfront attach``: stock engines serving SMG's engine gRPC proto, registered in the mesh (main.py)."""
