"""What a worker records of its episodes: videos, per-tick traces and a LeRobot dataset, behind
one recorder protocol; and the controller's merge of the workers' dataset parts."""
