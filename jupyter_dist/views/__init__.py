"""What the notebook shows: status tables, output views, charts."""
