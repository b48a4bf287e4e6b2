"""`autoaccel bench`: run a script and its conversion side by side and compare them."""
